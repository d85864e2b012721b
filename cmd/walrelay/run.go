package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/checkpoint"
	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/faultinject"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/replication"
	"github.com/walrelay/walrelay/sink"
)

func cmdRun(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cs := newConfigSet(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := cs.load(fs, true)
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr)
	log.Info("starting walrelay", append([]any{"version", version}, cs.effective()...)...)
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		// A soft limit: the collector works harder near it instead of
		// letting the heap double; what is in flight is bounded by the
		// producer's buffers (half of max_buffered_bytes queued, half in
		// flight, and the client's copy of the round), so the live heap
		// stays below it.
		debug.SetMemoryLimit(cfg.memoryLimit())
	}
	return scrubError(relay(ctx, cfg, log), cfg.secrets())
}

// relay runs the pipeline until ctx is cancelled (nil) or a fatal error.
func relay(ctx context.Context, cfg *Config, log *slog.Logger) error {
	schema, table, _ := cfg.table()
	oid, err := preflight(ctx, cfg, log, schema, table)
	if err != nil {
		return err
	}
	m := newMetrics()
	dec, err := decoder.New(decoder.Config{
		Schema: schema, Table: table, RelationID: oid,
		Columns: decoder.Columns{
			ID: cfg.Outbox.IDColumn, AggregateType: cfg.Outbox.AggregateTypeColumn, AggregateID: cfg.Outbox.AggregateIDColumn,
			Type: cfg.Outbox.TypeColumn, Payload: cfg.Outbox.PayloadColumn,
		},
		HeaderColumns:   cfg.Outbox.HeaderColumns,
		MessagePrefix:   cfg.Outbox.MessagePrefix,
		IgnoredPrefixes: cfg.Outbox.IgnorePrefixes,
	})
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	scfg, err := sinkConfig(cfg, log, kgo.WithHooks(kafkaHook{m}))
	if err != nil {
		return err
	}
	sk, err := sink.New(scfg)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer sk.Close()
	pingCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = sk.Ping(pingCtx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("kafka.brokers: %w", authHint(err))
	}

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	// Records are produced on a context that outlives the stop signal by
	// shutdown_timeout, so that a clean stop lets buffered records finish
	// instead of failing them (which would replay their whole transaction).
	produceCtx, cancelProduce := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelProduce()
	go func() {
		select {
		case <-runCtx.Done():
		case <-produceCtx.Done():
			return
		}
		select {
		case <-time.After(cfg.ShutdownTimeout):
			cancelProduce()
		case <-produceCtx.Done():
		}
	}()

	p := &pipeline{dec: dec, sink: sk, tr: checkpoint.New(0), produceCtx: produceCtx, stop: stopRun, log: log, m: m}
	stream, err := replication.New(replication.Config{
		ConnString: cfg.Postgres.DSN, Slot: cfg.Postgres.Slot, Publication: cfg.Postgres.Publication,
		StatusInterval: cfg.Postgres.StatusInterval, Logger: log,
		Handle: p.handle, Confirmed: p.tr.Confirmed, Keepalive: p.tr.Idle,
		Started: p.started, Flush: p.flush, Boundary: func() bool { return p.txn == nil }, Err: p.status,
		DrainTimeout: cfg.ShutdownTimeout, ReceiveTimeout: cfg.Postgres.ReceiveTimeout,
	})
	if err != nil {
		return err
	}
	m.register(stream, p)
	if cfg.Admin.Listen != "" {
		srv, err := serveAdmin(cfg.Admin.Listen, adminMux(m, stream, p, cfg.Postgres.Slot, m.kafkaReachable, cfg.Admin.Pprof), log)
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	var bg sync.WaitGroup
	defer bg.Wait()
	bg.Go(func() { m.pollSlot(runCtx, cfg.Postgres.DSN, cfg.Postgres.Slot, 5*time.Second, log) })
	// An unlogged partition attached while walrelay runs: its rows never
	// reach the WAL. Checked every 5 s; it stops walrelay, which can do
	// nothing else for them.
	bg.Go(func() {
		periodically(runCtx, cfg.Postgres.DSN, 5*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
			problems, err := replication.UnloggedPartitions(ctx, conn, schema, table)
			if err == nil && len(problems) > 0 {
				p.fail(fmt.Errorf("%s (rows written to it since it was attached or set unlogged are in the table only)", strings.Join(problems, "; ")))
			}
			return err
		}, func(err error) { log.Warn("check the outbox's partitions", "err", err) })
	})
	if cfg.Heartbeat.Interval > 0 {
		bg.Go(func() {
			heartbeat(runCtx, cfg.Postgres.DSN, cfg.Outbox.MessagePrefix+".heartbeat", cfg.Heartbeat.Interval, log)
		})
	}
	runErr := stream.Run(runCtx)
	stopRun()
	if err := p.failure(); err != nil {
		return err
	}
	if runErr != nil {
		return runErr
	}
	log.Info("walrelay stopped", "confirmed", p.tr.Confirmed().String(), "in_flight", p.tr.InFlight())
	return nil
}

// preflight checks the database before streaming, so that a mistake in the
// configuration is one clear line at start rather than a retry loop, and
// returns the outbox table's oid.
func preflight(ctx context.Context, cfg *Config, log *slog.Logger, schema, table string) (uint32, error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pgcfg, err := pgx.ParseConfig(cfg.Postgres.DSN)
	if err != nil {
		return 0, fmt.Errorf("postgres.dsn: %w", err)
	}
	conn, err := pgx.ConnectConfig(cctx, pgcfg)
	if err != nil {
		return 0, fmt.Errorf("postgres.dsn: connect: %w", err)
	}
	defer conn.Close(context.Background())
	var walLevel string
	if err := conn.QueryRow(cctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return 0, fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		return 0, fmt.Errorf("the server has wal_level = %s: set wal_level = logical in postgresql.conf and restart it", walLevel)
	}
	if err := checkTable(cctx, conn, cfg, schema, table); err != nil {
		return 0, err
	}
	if err := checkEmitFunction(cctx, conn, schema, cfg.Outbox.MessagePrefix); err != nil {
		return 0, err
	}
	var oid uint32
	if err := conn.QueryRow(cctx, "SELECT to_regclass($1)::oid", pgx.Identifier{schema, table}.Sanitize()).Scan(&oid); err != nil {
		return 0, fmt.Errorf("read the oid of %s.%s: %w", schema, table, err)
	}
	o := cfg.outbox(cfg.Postgres.Publication)
	if cfg.Postgres.CreateSlot {
		// The publication first: a slot only sees a publication created
		// before the changes it decodes.
		created, err := replication.EnsurePublication(cctx, conn, o)
		if err != nil {
			return 0, err
		}
		if created {
			log.Info("created publication", "publication", cfg.Postgres.Publication, "table", schema+"."+table)
		}
		created, err = replication.EnsureSlot(cctx, conn, cfg.Postgres.Slot, cfg.Postgres.Publication, false)
		if err != nil {
			return 0, err
		}
		if created {
			log.Info("created replication slot", "slot", cfg.Postgres.Slot)
		}
		if ok, err := replication.SlotRecorded(cctx, conn, cfg.Postgres.Publication, cfg.Postgres.Slot); err == nil && !ok {
			log.Warn("the slot could not be recorded on the publication (that needs the publication's owner): if the slot is dropped, walrelay cannot tell and would create it again, after the gap",
				"slot", cfg.Postgres.Slot, "publication", cfg.Postgres.Publication)
		}
		return oid, nil
	}
	problems, err := replication.CheckPublication(cctx, conn, o)
	if errors.Is(err, replication.ErrPublicationMissing) {
		return 0, fmt.Errorf("publication %s does not exist: run walrelay migrate, or set postgres.create_slot=true", cfg.Postgres.Publication)
	}
	if err != nil {
		return 0, err
	}
	if len(problems) > 0 {
		return 0, fmt.Errorf("publication %s: %s", cfg.Postgres.Publication, strings.Join(problems, "; "))
	}
	var slotOK bool
	if err := conn.QueryRow(cctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", cfg.Postgres.Slot).Scan(&slotOK); err != nil {
		return 0, fmt.Errorf("look up slot %s: %w", cfg.Postgres.Slot, err)
	}
	if !slotOK {
		return 0, fmt.Errorf("replication slot %s does not exist: run walrelay migrate, or set postgres.create_slot=true", cfg.Postgres.Slot)
	}
	return oid, nil
}

// checkEmitFunction refuses a walrelay_emit function in schema that emits
// under another prefix than the configured one: its events would not be
// read.
func checkEmitFunction(ctx context.Context, conn *pgx.Conn, schema, prefix string) error {
	var src string
	err := conn.QueryRow(ctx, "SELECT prosrc FROM pg_proc WHERE proname = 'walrelay_emit' AND pronamespace = to_regnamespace($1)", pgx.Identifier{schema}.Sanitize()).Scan(&src)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read function %s.walrelay_emit: %w", schema, err)
	}
	if !strings.Contains(src, migrations.EmitFunctionSQL(prefix)) {
		return fmt.Errorf("function %s.walrelay_emit emits under another prefix than outbox.message_prefix %q, so its events would not be published: "+
			"run walrelay migrate with this configuration to replace it", schema, prefix)
	}
	return nil
}

// checkTable checks that the outbox table exists with every configured
// column.
func checkTable(ctx context.Context, conn *pgx.Conn, cfg *Config, schema, table string) error {
	names, cols, err := tableColumns(ctx, conn, schema, table)
	if err != nil {
		return fmt.Errorf("read columns of %s.%s: %w", schema, table, err)
	}
	if len(names) == 0 {
		return fmt.Errorf("postgres.table: table %s.%s does not exist (create it with walrelay migrate)", schema, table)
	}
	for _, need := range cfg.requiredColumns() {
		if _, ok := cols[need.col]; !ok {
			return fmt.Errorf("table %s.%s has no column %q (%s); its columns are %s", schema, table, need.col, need.key, strings.Join(names, ", "))
		}
	}
	for _, h := range cfg.Outbox.HeaderColumns {
		if _, ok := cols[h]; !ok {
			return fmt.Errorf("table %s.%s has no column %q (outbox.header_columns)", schema, table, h)
		}
	}
	generated, err := generatedColumns(ctx, conn, cfg, schema, table)
	if err != nil {
		return err
	}
	if len(generated) > 0 {
		return fmt.Errorf("column %s of %s.%s is GENERATED: logical replication does not send generated columns; store the value in a plain column", strings.Join(generated, ", "), schema, table)
	}
	return nil
}

// generatedColumns lists the columns walrelay reads that are GENERATED:
// pgoutput leaves them out of what it sends (before PostgreSQL 18, and there
// unless asked), so their rows would stop the stream.
func generatedColumns(ctx context.Context, conn *pgx.Conn, cfg *Config, schema, table string) ([]string, error) {
	var generated []string
	err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(attname::text ORDER BY attnum), '{}') FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attgenerated <> '' AND attname = ANY ($2)`, pgx.Identifier{schema, table}.Sanitize(), cfg.readColumns()).Scan(&generated)
	if err != nil {
		return nil, fmt.Errorf("read the generated columns of %s.%s: %w", schema, table, err)
	}
	return generated, nil
}

// tableColumns returns the columns of schema.table in order and their types
// (format_type); none when the table does not exist.
func tableColumns(ctx context.Context, conn *pgx.Conn, schema, table string) ([]string, map[string]string, error) {
	rows, err := conn.Query(ctx, `SELECT a.attname, format_type(a.atttypid, NULL) FROM pg_attribute a
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, pgx.Identifier{schema, table}.Sanitize())
	if err != nil {
		return nil, nil, err
	}
	var names []string
	types := map[string]string{}
	var n, t string
	_, err = pgx.ForEachRow(rows, []any{&n, &t}, func() error {
		names = append(names, n)
		types[n] = t
		return nil
	})
	return names, types, err
}

// pipeline is the Handler behind the replication stream: it decodes each
// message, tracks transactions in the checkpoint and hands events to the
// sink. It runs on the receive goroutine; acks arrive on the sink's.
type pipeline struct {
	dec        *decoder.Decoder
	sink       *sink.Sink
	tr         *checkpoint.Tracker
	produceCtx context.Context
	stop       context.CancelFunc
	log        *slog.Logger

	txn *checkpoint.Txn // the open transaction
	m   *metrics
	cur *session // the session being streamed; set under mu by started

	mu         sync.Mutex
	err        error // the first fatal error
	restartErr error // a transient failure in this session: restart it
	// Persistent refusals in a row (sink.Persistent) with no event at or
	// after the last one's position acknowledged in between: after
	// maxPersistent of the same code, walrelay stops.
	persistentCode  int16
	persistentCount int
	persistentAt    atomic.Uint64 // WAL position of the last one; 0: none pending
	// troubled is set while err or restartErr is, so that the receive
	// goroutine checks one atomic per message instead of taking mu.
	troubled atomic.Bool
}

// session is what the records of one replication session share with their
// callbacks: which session a failure belongs to, and where it failed.
type session struct {
	failing atomic.Bool // a publish of this session failed
	mu      sync.Mutex
	failed  map[partitionOf]bool // the partitions of the failed records
}

type partitionOf struct {
	topic     string
	partition int32
}

// failedOn records a failed publish on d's partition.
func (s *session) failedOn(d sink.Delivery) {
	s.mu.Lock()
	s.failed[partitionOf{d.Topic, d.Partition}] = true
	s.mu.Unlock()
	s.failing.Store(true)
}

// overtook reports whether an acknowledged record of d's partition came
// after one that failed in this session. The client answers a partition's
// records in order, and the sink sends nothing after a failure until the
// failed record is resent (sink.Abort), so this must not happen: it would be
// a record written ahead of the failed one. It is checked, and counted, so
// that a break of that guarantee is seen rather than assumed away.
func (s *session) overtook(d sink.Delivery) bool {
	if !s.failing.Load() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed[partitionOf{d.Topic, d.Partition}]
}

func (p *pipeline) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.troubled.Store(true)
	p.mu.Unlock()
	p.stop()
}

func (p *pipeline) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// maxPersistent is how many identical persistent refusals in a row, with no
// progress in between, stop walrelay.
const maxPersistent = 5

// restart asks for the stream to start again: an event of s (at WAL
// position at) could not be delivered, and the server resends it, and all
// after it, in order. A failure from an earlier session is already being
// resent. The same persistent refusal maxPersistent times in a row is fatal.
func (p *pipeline) restart(s *session, err error, at pglogrepl.LSN) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s != p.cur || p.restartErr != nil {
		return
	}
	p.restartErr = err
	p.troubled.Store(true)
	var ke *kerr.Error
	if !sink.Persistent(err) || !errors.As(err, &ke) {
		return
	}
	if p.persistentAt.Load() != 0 && p.persistentCode == ke.Code {
		p.persistentCount++
	} else {
		p.persistentCode, p.persistentCount = ke.Code, 1
	}
	p.persistentAt.Store(max(uint64(at), 1))
	if p.persistentCount >= maxPersistent && p.err == nil {
		p.err = fmt.Errorf("kafka refused %d times in a row, with nothing published in between, with an error it does not call retriable: %w "+
			"(fix what the broker refuses: topic configuration, ACLs, quotas, the compression codec)", p.persistentCount, err)
		p.stop()
	}
}

// progressed notes that an event at WAL position at was acknowledged: a
// persistent refusal at or before it is not repeating.
func (p *pipeline) progressed(at pglogrepl.LSN) {
	if pending := p.persistentAt.Load(); pending != 0 && uint64(at) >= pending {
		p.mu.Lock()
		p.persistentAt.Store(0)
		p.persistentCount = 0
		p.mu.Unlock()
	}
}

// status is polled by the receive loop: a fatal error stops the stream, a
// transient one restarts it.
func (p *pipeline) status() error {
	if !p.troubled.Load() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.err
	}
	if p.restartErr != nil {
		return fmt.Errorf("%w: %w", replication.ErrRestart, p.restartErr)
	}
	return nil
}

// started resets per-stream state: the server resends everything after from.
// If the last session failed to publish, the sink sends nothing more of it
// and answers what it sent (sink.Abort) before the failed record is resent.
func (p *pipeline) started(ctx context.Context, from pglogrepl.LSN) error {
	p.mu.Lock()
	failed := p.restartErr != nil
	p.mu.Unlock()
	if failed {
		if err := p.sink.Abort(ctx); err != nil {
			return fmt.Errorf("settle the failed session's records: %w", err)
		}
	}
	p.mu.Lock()
	p.cur = &session{failed: map[partitionOf]bool{}}
	p.restartErr = nil
	p.troubled.Store(p.err != nil)
	p.mu.Unlock()
	p.dec.Reset()
	p.tr.Reset(from)
	p.txn = nil
	return nil
}

func (p *pipeline) handle(ctx context.Context, walStart pglogrepl.LSN, data []byte) error {
	// Nothing more is produced once a failure is known, so that the resent
	// events keep their order.
	if err := p.status(); err != nil {
		return err
	}
	msg, err := p.dec.Decode(walStart, data)
	if err != nil {
		return err
	}
	switch m := msg.(type) {
	case decoder.Begin:
		p.m.transactions.Inc()
		p.txn, err = p.tr.Begin(m.FinalLSN)
		return err
	case decoder.Commit:
		if p.txn == nil {
			return fmt.Errorf("commit at %s without an open transaction", m.CommitLSN)
		}
		err = p.txn.Commit(m.EndLSN)
		p.txn = nil
		return err
	case *decoder.Event:
		txn := p.txn
		if !m.Transactional {
			// A message outside any transaction is tracked as one of its own.
			if txn, err = p.tr.Begin(m.CommitLSN); err != nil {
				return err
			}
			txn.Add()
			if err := txn.Commit(m.CommitLSN); err != nil {
				return err
			}
		} else {
			txn.Add()
		}
		commit := m.CommitTime
		sess := p.cur
		p.sink.Publish(p.produceCtx, m, func(d sink.Delivery, err error) {
			if err != nil {
				sess.failedOn(d)
				txn.Fail()
				if sink.Fatal(err) {
					p.m.publishErrors.WithLabelValues("fatal").Inc()
					p.fail(err)
					return
				}
				// Not counted: failed because an earlier record failed (or
				// at shutdown).
				if !errors.Is(err, sink.ErrNotSent) && !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrAborting) {
					p.m.publishErrors.WithLabelValues("transient").Inc()
				}
				p.restart(sess, err, m.WALStart)
				return
			}
			p.progressed(m.WALStart)
			if sess.overtook(d) {
				p.m.orderBreaks.Inc()
				p.log.Error("an event was written ahead of an earlier event of its partition that failed and is sent again: consumers may see this aggregate's events out of order",
					"id", m.ID, "aggregate_id", m.AggregateID, "topic", d.Topic, "partition", d.Partition)
			}
			p.m.acked(d.Topic, d.DeadLetter, commit)
			faultinject.Acked()
			txn.Ack()
		})
		return nil
	case decoder.Ignored:
		if m.Kind != "relation" && m.Kind != "type" && m.Kind != "origin" {
			p.m.ignored.WithLabelValues(m.Kind).Inc()
		}
		p.log.Debug("ignored change", "kind", m.Kind, "lsn", walStart.String())
		return nil
	}
	return fmt.Errorf("decoder returned %T", msg)
}

// flush waits until every event handed to the sink is acknowledged, a fatal
// error happened, or ctx ends.
func (p *pipeline) flush(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if p.tr.InFlight() == 0 {
			return nil
		}
		if err := p.failure(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d events in flight: %w", p.tr.InFlight(), ctx.Err())
		case <-t.C:
		}
	}
}

// serveAdmin serves mux on addr until Close.
func serveAdmin(addr string, mux *http.ServeMux, log *slog.Logger) (*http.Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin.listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin listener stopped", "err", err)
		}
	}()
	log.Info("admin listener", "addr", l.Addr().String())
	return srv, nil
}

// heartbeat writes a non-transactional logical decoding message every
// interval, so that the slot has WAL of this database to move past even when
// only other databases on the server write. The decoder ignores them.
func heartbeat(ctx context.Context, dsn, prefix string, every time.Duration, log *slog.Logger) {
	periodically(ctx, dsn, every, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(false, $1, now()::text)", prefix)
		return err
	}, func(err error) { log.Warn("heartbeat failed", "err", err) })
}

// periodically runs fn on a connection of its own every interval until ctx
// ends (first after one interval), connecting again after a failure, which
// it reports to onErr.
func periodically(ctx context.Context, dsn string, every time.Duration, fn func(context.Context, *pgx.Conn) error, onErr func(error)) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var err error
		if conn == nil || conn.IsClosed() {
			conn, err = pgx.Connect(qctx, dsn)
		}
		if err == nil {
			err = fn(qctx, conn)
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			onErr(err)
			if conn != nil {
				conn.Close(context.Background())
				conn = nil
			}
		}
	}
}
