package poll

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/internal/backoff"
	"github.com/walrelay/walrelay/recovery"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/sink"
	"github.com/walrelay/walrelay/sink/record"
)

// Ordering values.
const (
	OrderAggregate = "aggregate" // an aggregate's rows in insert order
	OrderNone      = "none"      // any due row, in insert order, in parallel
)

// OnDead values: what a DEAD row does to the later rows of its aggregate.
const (
	DeadSkip  = "skip"  // they go on, as after a dead letter of the WAL source
	DeadBlock = "block" // they wait until the row is retried (walrelay poll retry) or deleted
)

// ReasonMaxAttempts is the dead-letter reason of a row that failed
// MaxAttempts times.
const ReasonMaxAttempts = "max_attempts"

// Config configures a Poller. Zero values mean the defaults.
type Config struct {
	// ConnConfig is the database with the outbox; every connection uses a
	// copy.
	ConnConfig *pgx.ConnConfig
	// Outbox is the outbox tables and their columns (message prefixes are
	// unused: the poll source reads no WAL).
	Outbox decoder.Config
	// Interval is the longest wait between polls when no notification
	// comes. Default 1s.
	Interval time.Duration
	// BatchSize is the most rows claimed per table at once. Default 1000.
	BatchSize int
	// MaxBatchBytes bounds a claim's rows (every column's text), so that
	// what the poller holds stays bounded whatever their size; a claim takes at
	// least one row. Default half of the sink's MaxBufferedBytes (8 MiB).
	MaxBatchBytes int
	// MaxEventBytes is the largest row (every column's text) a claim reads:
	// a row larger is claimed without its columns (but the short ones that
	// name it) and dead-lettered (too_large, with its size), so that one
	// large row is never held in memory, whichever column is large.
	// Default 16 MiB.
	MaxEventBytes int64
	// Lease is how long a claim holds its rows; it is renewed while Kafka
	// has not answered. Default 30s.
	Lease time.Duration
	// MaxAttempts is how many claims a row gets before it goes to the
	// dead-letter topic and DEAD. Default 20.
	MaxAttempts int
	// Ordering is OrderAggregate (default) or OrderNone.
	Ordering string
	// OnDead is DeadSkip (default) or DeadBlock.
	OnDead string
	// WorkerID names this instance in claim_id. Default host-pid. Claim
	// ids are unique whatever it is: each Poller adds a random token of
	// its own.
	WorkerID string
	// ShutdownTimeout bounds the wait for Kafka's answers when ctx ends.
	// Default 20s.
	ShutdownTimeout time.Duration
	// Sink configures the Kafka producer. Publisher, if set, is used
	// instead (the poller closes it).
	Sink      sink.Config
	Publisher Publisher
	// Logger receives the poller's logs. Nil is slog.Default(); pass
	// slog.New(slog.DiscardHandler) to discard.
	Logger *slog.Logger
	// Hooks are the relay's hooks (Acked, PublishError, OrderBreak);
	// PollHooks observe claims and marks.
	Hooks     relay.Hooks
	PollHooks Hooks
}

// Hooks observe the poller, for metrics; each may be nil and must not
// block.
type Hooks struct {
	// Claimed is called after each claim of a table: rows claimed, of them
	// rows whose lease had expired, and how long it took.
	Claimed func(table string, rows, expired int, took time.Duration)
	// Marked is called after each mark: rows marked SENT, back to PENDING
	// after a failure, DEAD, and rows whose claim was lost (another worker
	// claimed them after the lease expired: they were sent twice).
	Marked func(table string, took time.Duration, sent, retried, dead, lost int)
	// Released is called after each release of parked rows (before each
	// claim): rows set back to PENDING, or the release's error (the claim
	// runs all the same).
	Released func(table string, rows int64, err error)
}

// Publisher is what the poller needs of a sink: *sink.Sink is one.
type Publisher interface {
	relay.Publisher
	DeadLetter(ctx context.Context, e *event.Event, reason string, cause error, done sink.Done)
	Topic(e *event.Event) string
}

var _ Publisher = (*sink.Sink)(nil)

// Poller relays the outbox tables by polling them. Create it with New and
// call Run once; its accessors are safe for concurrent use.
type Poller struct {
	cfg      Config
	log      *slog.Logger
	sink     Publisher
	state    atomic.Value // string
	inFlight atomic.Int64
	reconn   atomic.Uint64
	claims   atomic.Uint64
	start    string // a random token of this Poller, in every claim id
	errMu    sync.Mutex
	err      error
	outMu    sync.Mutex // guards the rows' callback answers (row.cb)
	wake     chan struct{}
	tables   []*table
	// unmarked are claims whose mark failed (the connection was lost):
	// marked first once connected again, before their leases end.
	unmarked []*claimed
}

// New checks cfg, fills its defaults and creates the producer; it does no
// I/O (Run does).
func New(cfg Config) (*Poller, error) {
	if cfg.ConnConfig == nil {
		return nil, errors.New("poll: ConnConfig is required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 1000
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	if cfg.MaxEventBytes <= 0 {
		cfg.MaxEventBytes = 16 << 20
	}
	if cfg.MaxBatchBytes <= 0 {
		buffered := cfg.Sink.MaxBufferedBytes
		if buffered <= 0 {
			buffered = 16 << 20 // the sink's default
		}
		cfg.MaxBatchBytes = buffered / 2
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 20
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 20 * time.Second
	}
	if err := CheckSettings(cfg.Ordering, cfg.OnDead, cfg.Lease); err != nil {
		return nil, err
	}
	if cfg.Ordering == "" {
		cfg.Ordering = OrderAggregate
	}
	if cfg.OnDead == "" {
		cfg.OnDead = DeadSkip
	}
	if cfg.WorkerID == "" {
		host, _ := os.Hostname()
		cfg.WorkerID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if cfg.Sink.Transactions != nil {
		return nil, errors.New("kafka.exactly_once: the poll source marks rows in PostgreSQL after Kafka acknowledged them, outside any Kafka transaction; it delivers at least once (use source: wal for exactly-once)")
	}
	cfg.Outbox = cfg.Outbox.WithDefaults()
	cfg.Hooks = cfg.Hooks.WithDefaults()
	if cfg.PollHooks.Claimed == nil {
		cfg.PollHooks.Claimed = func(string, int, int, time.Duration) {}
	}
	if cfg.PollHooks.Released == nil {
		cfg.PollHooks.Released = func(string, int64, error) {}
	}
	if cfg.PollHooks.Marked == nil {
		cfg.PollHooks.Marked = func(string, time.Duration, int, int, int, int) {}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Sink.Logger == nil {
		cfg.Sink.Logger = log
	}
	sk := cfg.Publisher
	if sk == nil {
		k, err := sink.New(cfg.Sink)
		if err != nil {
			return nil, fmt.Errorf("kafka: %w", err)
		}
		sk = k
	}
	var token [8]byte
	if _, err := rand.Read(token[:]); err != nil {
		sk.Close()
		return nil, fmt.Errorf("poll: a token for the claim ids: %w", err)
	}
	p := &Poller{cfg: cfg, log: log, sink: sk, wake: make(chan struct{}, 1), start: hex.EncodeToString(token[:])}
	p.state.Store("starting")
	return p, nil
}

// CheckSettings checks the poll settings that a value alone can tell.
func CheckSettings(ordering, onDead string, lease time.Duration) error {
	switch ordering {
	case "", OrderAggregate, OrderNone:
	default:
		return fmt.Errorf("poll.ordering %q: want aggregate or none", ordering)
	}
	switch onDead {
	case "", DeadSkip, DeadBlock:
	default:
		return fmt.Errorf("poll.on_dead %q: want skip or block", onDead)
	}
	if lease > 0 && lease < time.Second {
		return fmt.Errorf("poll.lease %s: want at least 1s", lease)
	}
	return nil
}

// State returns what the poller is doing: "starting", "polling",
// "reconnecting" or "stopped".
func (p *Poller) State() string { return p.state.Load().(string) }

// InFlight returns how many claimed rows are published and not yet
// answered.
func (p *Poller) InFlight() int { return int(p.inFlight.Load()) }

// Reconnects returns how many times the poller connected again.
func (p *Poller) Reconnects() uint64 { return p.reconn.Load() }

// DataLosses returns how many times the producer detected data loss.
func (p *Poller) DataLosses() uint64 { return p.sink.DataLosses() }

// Err returns the fatal error that stopped the poller, if any.
func (p *Poller) Err() error {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	return p.err
}

// ConnConfig returns the configuration the poller connects with; callers
// connect with a copy.
func (p *Poller) ConnConfig() *pgx.ConnConfig { return p.cfg.ConnConfig }

// Run polls until ctx is cancelled (it then waits for Kafka's answers,
// marks what it can and returns nil) or a fatal error, which it returns.
func (p *Poller) Run(ctx context.Context) error {
	defer p.state.Store("stopped")
	defer p.sink.Close()
	err := p.run(ctx)
	if err != nil {
		p.errMu.Lock()
		p.err = err
		p.errMu.Unlock()
	}
	return err
}

func (p *Poller) run(ctx context.Context) error {
	db, err := p.connect(ctx, true)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer func() { db.Close(context.Background()) }()
	// Fatal at start: a table that lacks what the poll source needs.
	for _, l := range p.cfg.Outbox.Layouts() {
		if err := CheckTable(ctx, db, l); err != nil {
			return err
		}
		if err := relay.CheckChildPrivileges(ctx, db, l); err != nil {
			return err
		}
	}
	// A walrelay_emit that writes WAL messages, which this source never
	// reads, would lose its events.
	o := p.cfg.Outbox
	o.Messages = false
	if err := relay.CheckEmitFunction(ctx, db, o); err != nil {
		return fmt.Errorf("%w (source poll: walrelay migrate --poll)", err)
	}
	if err := p.describe(ctx, db); err != nil {
		return err
	}
	if err := relay.WaitForBrokers(ctx, p.sink, p.log); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	listenCtx, stopListen := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { p.listen(listenCtx) })
	defer func() { stopListen(); bg.Wait() }()

	// Records are produced on a context that outlives ctx by the shutdown
	// timeout, so that a clean stop lets them be answered and marked.
	produceCtx, cancelProduce := relay.Outlive(ctx, p.cfg.ShutdownTimeout)
	defer cancelProduce()
	p.log.Info("polling the outbox", "tables", len(p.tables), "worker", p.cfg.WorkerID, "claim_prefix", p.cfg.WorkerID+":"+p.start, "interval", p.cfg.Interval, "batch", p.cfg.BatchSize,
		"lease", p.cfg.Lease, "ordering", p.cfg.Ordering, "on_dead", p.cfg.OnDead, "max_attempts", p.cfg.MaxAttempts)
	p.state.Store("polling")
	fails := 0
	for ctx.Err() == nil {
		n, err := p.round(ctx, produceCtx, &db)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if failure.IsFatal(err) {
				return err
			}
			p.state.Store("reconnecting")
			wait := backoff.Wait(100*time.Millisecond, 10*time.Second, fails)
			fails++
			p.log.Warn("poll round failed; retrying", "err", err, "in", wait)
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			continue
		}
		if fails > 0 {
			fails = 0
			p.state.Store("polling")
		}
		if n > 0 {
			continue // more may be due at once
		}
		t := time.NewTimer(p.cfg.Interval)
		select {
		case <-ctx.Done():
		case <-p.wake:
		case <-t.C:
		}
		t.Stop()
	}
	p.log.Info("walrelay stopped", "claims", p.claims.Load())
	return nil
}

// connect opens a connection, retrying with backoff while the server
// cannot be reached; main says it is the claims' connection, whose
// attempts the state and the reconnect count show (the notification
// connection's do not).
func (p *Poller) connect(ctx context.Context, main bool) (*pgx.Conn, error) {
	for try := 0; ; try++ {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		conn, err := pgx.ConnectConfig(cctx, p.cfg.ConnConfig.Copy())
		cancel()
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if try == 0 && failure.IsFatal(classify(err)) {
			return nil, fmt.Errorf("postgres.dsn: connect: %w", err)
		}
		if main {
			p.state.Store("reconnecting")
			p.reconn.Add(1)
		}
		wait := backoff.Wait(100*time.Millisecond, 10*time.Second, try)
		p.log.Warn("connect to PostgreSQL failed; retrying", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// changed marks fatal an error that says the table changed under the
// poller (a column or the table gone, a type changed: SQLSTATE class 42):
// retrying would fail the same way.
func changed(err error, table string) error {
	var pe interface{ SQLState() string }
	if errors.As(err, &pe) && strings.HasPrefix(pe.SQLState(), "42") {
		return failure.Mark(failure.Fatal, fmt.Errorf("%w (the outbox table %s changed under walrelay: run walrelay check, and walrelay migrate --poll)", err, table))
	}
	return err
}

// classify marks a connection error fatal when retrying cannot fix it
// (authentication, a database that does not exist).
func classify(err error) error {
	var pe interface{ SQLState() string }
	if errors.As(err, &pe) {
		switch pe.SQLState() {
		case "28P01", "28000", "3D000":
			return failure.Mark(failure.Fatal, err)
		}
	}
	return err
}

// sessionSettings are the planner settings of the poller's session. The
// claims walk the indexes: a table just loaded has no statistics, and a
// plan that scans the whole backlog for every claim would make the
// catch-up quadratic. JIT is off: the settings above price the plans
// past jit_above_cost, and a server built with LLVM would compile each
// claim, a small query, for longer than it runs (3 s a claim instead of
// 0.3 ms, seen in a test's session with three workers on a loaded
// machine). recovery.Open, which describe calls next, turns it off too:
// it is said here so that the claims do not rest on that.
const sessionSettings = "SET enable_seqscan = off; SET enable_sort = off; SET jit = off"

// describe reads each table's columns and prepares its statements.
func (p *Poller) describe(ctx context.Context, db *pgx.Conn) error {
	if _, err := db.Exec(ctx, sessionSettings); err != nil {
		return fmt.Errorf("set the session's planner settings: %w", err)
	}
	p.tables = p.tables[:0]
	for _, l := range p.cfg.Outbox.Layouts() {
		t, err := recovery.Open(ctx, db, l)
		if err != nil {
			return failure.Mark(failure.Fatal, err)
		}
		tl := t.Layout()
		if err := record.CheckKeyColumn(p.cfg.Sink.KeyFormat, format.KeyColumn{Type: t.ColumnType(tl.Columns.AggregateID), Nullable: tl.AggregateIDNullable}); err != nil {
			return failure.Mark(failure.Fatal, fmt.Errorf("%s.%s: %w", t.Name(), tl.Columns.AggregateID, err))
		}
		p.tables = append(p.tables, newTable(t, p.cfg))
	}
	return nil
}
