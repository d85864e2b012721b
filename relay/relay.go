package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/checkpoint"
	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/pgdsn"
	"github.com/walrelay/walrelay/replication"
	"github.com/walrelay/walrelay/sink"
)

// Config configures a Relay. Zero values mean the defaults.
type Config struct {
	// ConnString is the PostgreSQL connection string (URL or key=value) of
	// the database with the outbox. ConnConfig, if set, is used instead: a
	// configuration parsed by pgx.ParseConfig and changed (a custom dialer,
	// a password fetched per connection); every connection uses a copy.
	ConnString string
	ConnConfig *pgx.ConnConfig
	// Slot is the logical replication slot. Default "walrelay".
	Slot string
	// Publication is the publication of the outbox. Default
	// "walrelay_outbox".
	Publication string
	// CreateSlot creates the publication and the slot at start if they are
	// missing, on a database where walrelay never created the slot (see
	// replication.EnsureSlot). Off, both must exist.
	CreateSlot bool
	// SlotFailover marks the slot for failover at start (PostgreSQL 17+;
	// replication.MarkFailover), so that a standby keeps a copy of it.
	SlotFailover bool
	// AllowRowFilter accepts a row filter on the outbox in the publication:
	// a shard of a sharded outbox.
	AllowRowFilter bool
	// StatusInterval and ReceiveTimeout are replication.Config's. Defaults
	// 1s and 30s.
	StatusInterval, ReceiveTimeout time.Duration
	// MaxMessageBytes is the largest message of the server held in memory
	// (replication.Config's): the event of a larger insert or logical
	// message is dead-lettered as too_large, without its payload, with its
	// size and what identifies it. Default 16 MiB.
	MaxMessageBytes int64
	// Outbox is the outbox tables, their columns and the message
	// prefixes; the tables' RelationIDs are read at start.
	Outbox decoder.Config
	// Sink configures the Kafka producer. Publisher, if set, is used
	// instead (the relay closes it).
	Sink      sink.Config
	Publisher Publisher
	// HeartbeatInterval, if set, writes a heartbeat message to the WAL this
	// often, so that the slot moves when only other databases write.
	HeartbeatInterval time.Duration
	// ShutdownTimeout bounds the drain when ctx is cancelled: reading to
	// the end of the open transaction, and waiting for the events in
	// flight. Default 20s.
	ShutdownTimeout time.Duration
	// RefusalStopAfter is the least time over which the broker must refuse
	// the same event, with the same code that no healthy cluster answers
	// with for long (POLICY_VIOLATION; sink.Persistent), before the relay
	// stops, besides five sessions in a row. Default 2m (refusal.go says
	// why). Codes a healthy cluster answers with for a while (sink.Held)
	// never stop it.
	RefusalStopAfter time.Duration
	// Logger receives the relay's logs. Nil is slog.Default(); pass
	// slog.New(slog.DiscardHandler) to discard.
	Logger *slog.Logger
	// Hooks observe the pipeline.
	Hooks Hooks
}

// Hooks observe the pipeline, for metrics; each may be nil. They are called
// from the pipeline's goroutines (the receive loop, the producer's
// callbacks) and must not block.
type Hooks struct {
	// Transaction is called for each transaction received.
	Transaction func()
	// Acked is called for each event Kafka acknowledged: of its outbox
	// table (Event.Source), on its topic, or on the dead-letter topic for
	// the reason deadLetter.
	Acked func(table, topic, deadLetter string, commitTime time.Time)
	// PublishError is called for a publish that failed, by kind: "transient"
	// (the stream restarts) or "fatal" (the relay stops). A record failed
	// only because an earlier one did is not counted.
	PublishError func(kind string)
	// OrderBreak is called for an event written ahead of an earlier event of
	// its partition that failed: it must never be called.
	OrderBreak func()
	// Ignored is called for each change that is not an event, by kind
	// (decoder.Ignored's), but for relation, type and origin messages.
	Ignored func(kind string)
}

// WithDefaults returns h with each nil hook a no-op.
func (h Hooks) WithDefaults() Hooks {
	h.defaults()
	return h
}

func (h *Hooks) defaults() {
	if h.Transaction == nil {
		h.Transaction = func() {}
	}
	if h.Acked == nil {
		h.Acked = func(string, string, string, time.Time) {}
	}
	if h.PublishError == nil {
		h.PublishError = func(string) {}
	}
	if h.OrderBreak == nil {
		h.OrderBreak = func() {}
	}
	if h.Ignored == nil {
		h.Ignored = func(string) {}
	}
}

// Publisher is what the relay needs of a sink: *sink.Sink is one. Publish
// answers each event once through done, in order per partition; after a
// failure that fails the records behind it, it sends nothing until Abort,
// which returns once everything sent before it is answered.
type Publisher interface {
	Ping(ctx context.Context) error
	Publish(ctx context.Context, e *event.Event, done sink.Done)
	Abort(ctx context.Context) error
	Close()
	// DataLosses counts the producer's detections of data loss.
	DataLosses() uint64
}

var _ Publisher = (*sink.Sink)(nil)

// Relay is the pipeline from a replication slot to Kafka. Create it with New
// and call Run once; its accessors are safe for concurrent use.
type Relay struct {
	mu   sync.Mutex // guards sink while Run may set it
	cfg  Config
	log  *slog.Logger
	sink Publisher
	src  source
	p    *pipeline
}

// New checks cfg, fills its defaults and creates the producer and the
// stream; it does no I/O (Run does).
func New(cfg Config) (*Relay, error) {
	if cfg.ConnConfig == nil {
		if cfg.ConnString == "" {
			return nil, errors.New("relay: ConnString or ConnConfig is required")
		}
		c, err := pgx.ParseConfig(cfg.ConnString)
		if err != nil {
			return nil, fmt.Errorf("postgres.dsn: %w", pgdsn.ParseError(err)) // pgconn's own text quotes the DSN
		}
		if err := pgdsn.Check(cfg.ConnString); err != nil {
			return nil, fmt.Errorf("postgres.dsn: %w", err)
		}
		cfg.ConnConfig = c
	}
	if cfg.Slot == "" {
		cfg.Slot = "walrelay"
	}
	if cfg.Publication == "" {
		cfg.Publication = "walrelay_outbox"
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 20 * time.Second
	}
	if cfg.RefusalStopAfter == 0 {
		cfg.RefusalStopAfter = persistentSpan
	}
	cfg.Outbox = cfg.Outbox.WithDefaults()
	cfg.Hooks.defaults()
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Sink.Logger == nil {
		cfg.Sink.Logger = log
	}
	sk := cfg.Publisher
	if sk == nil && cfg.Sink.Transactions == nil {
		k, err := sink.New(cfg.Sink)
		if err != nil {
			return nil, fmt.Errorf("kafka: %w", err)
		}
		sk = k
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = replication.DefaultMaxMessageBytes
	}
	// In exactly-once mode the sink is made by Run, once the database's
	// identity, part of the transactional id, is known.
	r := &Relay{cfg: cfg, log: log, sink: sk}
	r.p = &pipeline{sink: sk, tr: checkpoint.New(0), log: log, hooks: cfg.Hooks, stop: func() {}, stopAfter: cfg.RefusalStopAfter}
	stream, err := replication.New(replication.Config{
		ConnConfig: &cfg.ConnConfig.Config, Slot: cfg.Slot, Publication: cfg.Publication,
		StatusInterval: cfg.StatusInterval, ReceiveTimeout: cfg.ReceiveTimeout, MaxMessageBytes: cfg.MaxMessageBytes, Logger: log,
	})
	if err != nil {
		if sk != nil {
			sk.Close()
		}
		return nil, err
	}
	r.src = replicationSource{stream}
	return r, nil
}

// Run runs the pipeline until ctx is cancelled (it then drains and returns
// nil) or a fatal error, which it returns. It checks the database first
// (preflight) and the brokers' addresses (a first PingBrokers), then
// creates what a first start needs (prepareSlot), then waits for Kafka to
// answer if it is down (WaitForBrokers): a start that fails leaves no new
// slot behind, and one that waits for Kafka misses no row committed while
// it waits.
func (r *Relay) Run(ctx context.Context) error {
	cfg := &r.cfg
	dcfg, err := preflight(ctx, cfg, r.log)
	if err != nil {
		if r.sink != nil {
			r.sink.Close()
		}
		return err
	}
	if r.sink == nil {
		if err := r.newTransactionalSink(ctx); err != nil {
			return err
		}
	}
	defer r.sink.Close()
	if r.p.dec, err = decoder.New(dcfg); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	// A broker that is misnamed or does not speak Kafka fails the start
	// before anything is created. Kafka that is down, or answers as a
	// cluster that recovers (recovering), does not: the slot is
	// created (rows committed from now on are in its stream, as they would
	// be mid-run) and the start waits for Kafka, reading nothing.
	pingErr := PingBrokers(ctx, r.sink)
	if pingErr != nil && ctx.Err() == nil && !BrokersDown(pingErr) && !recovering(pingErr) {
		return pingErr
	}
	createdSlot, err := prepareSlot(ctx, cfg, dcfg, r.log)
	if err != nil {
		if createdSlot {
			// Created, then marking it for failover failed (or the start
			// was stopped): the slot stays.
			leftSlot(cfg, r.log, ctx.Err() != nil, err)
		}
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if pingErr != nil {
		if err := WaitForBrokers(ctx, r.sink, r.log); err != nil {
			if ctx.Err() != nil {
				// Stopped while it waited (Ctrl-C, SIGTERM; perhaps
				// because the address was mistyped): the slot this start
				// created stays, and is named.
				if createdSlot {
					leftSlot(cfg, r.log, true, nil)
				}
				return nil
			}
			// Kafka answered at last, with something that fails the start
			// (a listener that wants TLS): the slot this start created stays.
			if createdSlot {
				leftSlot(cfg, r.log, false, err)
			}
			return err
		}
	}

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	r.p.stop = stopRun

	var bg sync.WaitGroup
	defer bg.Wait()
	// An unlogged partition attached while walrelay runs: its rows never
	// reach the WAL. An outbox table taken out of the publication (or the
	// publication changed so) while walrelay runs: pgoutput passes its rows
	// over, with no error. Checked every 5 s; each stops the relay, which
	// can do nothing else for those rows: only the table has them.
	layouts := dcfg.Layouts()
	tables := PublicationSpec(dcfg, cfg.Publication, cfg.AllowRowFilter).Tables
	// The first reading is taken now, before the stream starts: a table
	// taken out and put back before the first check is seen too.
	membership, lastGood, err := watchPublication(runCtx, cfg, tables)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	bg.Go(func() {
		Periodically(runCtx, cfg.ConnConfig, checkInterval, func(ctx context.Context, conn *pgx.Conn) error {
			for _, l := range layouts {
				problems, err := replication.UnloggedPartitions(ctx, conn, l.Schema, l.Table)
				if err != nil {
					return err
				}
				if len(problems) > 0 {
					r.p.fail(fmt.Errorf("%s (rows written to it since it was attached or set unlogged are in the table only)", strings.Join(problems, "; ")))
				}
			}
			now, problems, err := replication.WatchPublication(ctx, conn, cfg.Publication, tables, membership)
			if err != nil {
				return err
			}
			if len(problems) > 0 {
				r.p.fail(publicationChanged(cfg.Publication, problems, tables, lastGood))
				return nil
			}
			membership, lastGood = now, time.Now()
			return nil
		}, func(err error) { r.log.Warn("check the outbox's partitions and publication", "err", err) })
	})
	if cfg.HeartbeatInterval > 0 {
		bg.Go(func() {
			heartbeat(runCtx, cfg.ConnConfig, cfg.Outbox.MessagePrefix+".heartbeat", cfg.HeartbeatInterval, r.log)
		})
	}
	return r.pump(runCtx)
}

// pump runs the loop until ctx ends (it then drains: nil) or a fatal error,
// which it returns; r.p.stop must cancel ctx.
func (r *Relay) pump(ctx context.Context) error {
	// Records are produced on a context that outlives the stop signal by
	// the shutdown timeout, so that a clean stop lets buffered records
	// finish instead of failing them (which would replay their whole
	// transaction).
	produceCtx, cancelProduce := Outlive(ctx, r.cfg.ShutdownTimeout)
	defer cancelProduce()
	r.p.produceCtx = produceCtx
	runErr := r.stream(ctx)
	r.p.stop()
	if err := r.p.failure(); err != nil {
		return err
	}
	if runErr != nil {
		return runErr
	}
	if fence := r.p.takeFence(); fence != nil {
		return stoppedFenced(fence)
	}
	r.log.Info("walrelay stopped", "confirmed", r.p.tr.Confirmed().String(), "in_flight", r.p.tr.InFlight())
	return nil
}

// Outlive returns a context that ends grace after ctx ends, or when its
// cancel is called: what a source produces on, so that a stop lets the
// records in flight be answered.
func Outlive(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	out, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		select {
		case <-ctx.Done():
		case <-out.Done():
			return
		}
		select {
		case <-time.After(grace):
			cancel()
		case <-out.Done():
		}
	}()
	return out, cancel
}

// Run runs a relay of cfg until ctx is cancelled or a fatal error: New, then
// Relay.Run.
func Run(ctx context.Context, cfg Config) error {
	r, err := New(cfg)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// State returns what the replication stream is doing: "starting",
// "streaming", "waiting_for_slot", "reconnecting" or "stopped".
func (r *Relay) State() string { return r.src.State() }

// ReceivedLSN returns the highest WAL position received.
func (r *Relay) ReceivedLSN() pglogrepl.LSN { return r.src.ReceivedLSN() }

// ConfirmedLSN returns the position confirmed to the slot: every event
// before it is acknowledged.
func (r *Relay) ConfirmedLSN() pglogrepl.LSN { return r.p.tr.Confirmed() }

// InFlight returns how many events are published and not yet acknowledged.
func (r *Relay) InFlight() int { return r.p.tr.InFlight() }

// Reconnects returns how many times the stream started again.
func (r *Relay) Reconnects() uint64 { return r.src.Reconnects() }

// DataLosses returns how many times the producer detected data loss.
func (r *Relay) DataLosses() uint64 {
	if sk := r.publisher(); sk != nil {
		return sk.DataLosses()
	}
	return 0
}

// ConnConfig returns the configuration the relay connects with; callers
// connect with a copy.
func (r *Relay) ConnConfig() *pgx.ConnConfig { return r.cfg.ConnConfig }

// Err returns the fatal error that stops the relay, if any yet.
func (r *Relay) Err() error { return r.p.failure() }

// publisher returns the sink, nil before Run made it.
func (r *Relay) publisher() Publisher {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sink
}
