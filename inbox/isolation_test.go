package inbox_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/sink"
)

// TestRepeatableReadPoolHandlesOnce: the claims serialize on an advisory
// lock and then look in a statement of their own, which sees what the
// claim they waited for committed only in READ COMMITTED. A pool whose
// default_transaction_isolation is repeatable read (a database, role or
// DSN setting) must not give the consumer's claim a snapshot taken before
// its wait: an event claimed by the two-argument claim (a service in
// another language, a consumer of the earlier layout) and in flight while
// the consumer reads it is handled once. Before, the consumer began its
// transactions with the pool's default isolation and handled it again.
func TestRepeatableReadPoolHandlesOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ctx := t.Context()
	rr := repeatableReadPool(t, e.dsn)

	// The other claimant holds the event, handles it and commits later.
	other, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(context.Background()) //nolint:errcheck
	var fresh bool
	if err := other.QueryRow(ctx, "SELECT walrelay_inbox_claim('shipping', 'evt-rr')").Scan(&fresh); err != nil || !fresh {
		t.Fatalf("the other claim: %v %v", fresh, err)
	}
	if _, err := other.Exec(ctx, "INSERT INTO effects (event_id, key, seq) VALUES ('evt-rr', 'order-1', 1)"); err != nil {
		t.Fatal(err)
	}

	stop := e.start(t, inbox.Config{Postgres: rr}, record)
	e.produce(t, event("evt-rr", "order-1", 1))
	// The consumer's claim waits on the advisory lock meanwhile.
	deadline := time.Now().Add(15 * time.Second)
	for {
		var waiting int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND datname = current_database()`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the consumer's claim never waited on the other claim")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	perID, _ := e.effects(t)
	if n := perID["evt-rr"]; n != 1 {
		t.Fatalf("event evt-rr handled %d times (the other claimant's, then the consumer's in a pool whose default isolation is repeatable read), want once", n)
	}
}

// repeatableReadPool is a pool on dsn whose sessions' default isolation is
// repeatable read.
func repeatableReadPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	rr, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rr.Close)
	return rr
}

// TestClaimsRefuseOtherIsolation: both claim functions (the per-topic one
// and the two-argument one that services in other languages call) raise
// an error in a transaction that is not READ COMMITTED, whose snapshot
// would not see a claim they waited for: a caller that begins its
// transaction REPEATABLE READ or SERIALIZABLE (or runs on a pool that
// defaults to it) learns it at once instead of handling an event twice.
// In READ COMMITTED they claim.
func TestClaimsRefuseOtherIsolation(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ctx := t.Context()
	rr := repeatableReadPool(t, e.dsn)
	for _, c := range []struct {
		name string
		pool interface {
			BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
		}
		iso  pgx.TxIsoLevel
		want string // "" claims
	}{
		{"repeatable read", e.pool, pgx.RepeatableRead, "read committed"},
		{"serializable", e.pool, pgx.Serializable, "read committed"},
		{"pool default repeatable read", rr, "", "read committed"},
		{"read committed", rr, pgx.ReadCommitted, ""},
	} {
		for _, call := range []string{"SELECT walrelay_inbox_claim('shipping', $1)", "SELECT walrelay_inbox_claim('shipping', 'orders', $1)"} {
			tx, err := c.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: c.iso})
			if err != nil {
				t.Fatal(err)
			}
			var fresh bool
			err = tx.QueryRow(ctx, call, "iso-"+c.name).Scan(&fresh)
			_ = tx.Rollback(ctx)
			if c.want == "" && (err != nil || !fresh) {
				t.Errorf("%s, %s: %v, %v; want claimed", c.name, call, fresh, err)
			}
			if c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Errorf("%s, %s: %v, %v; want an error naming %s", c.name, call, fresh, err, c.want)
			}
		}
	}
}

// TestRetentionCountsTheSegmentRoll: Kafka deletes records a segment at a
// time, once the segment's newest record is older than retention.ms, and
// a segment takes records for segment.ms before it rolls (default 7 days,
// longer than many retention.ms): a record stays readable up to
// retention.ms + segment.ms, and a group whose offsets expired reads it
// again after its inbox row was deleted. Run refuses a Retention shorter
// than that sum, naming segment.ms, and starts with one as long. A topic
// that does not exist yet is checked against the broker's defaults, which
// it will take (kfake's: 7 days each). Before, Retention was checked
// against retention.ms alone, and a topic that did not exist not at all.
func TestRetentionCountsTheSegmentRoll(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	const quiet = "outbox.event.quiet"
	if err := e.kc.CreateTopic(quiet, 1, map[string]string{"retention.ms": "86400000", "segment.ms": "604800000"}); err != nil {
		t.Fatal(err)
	}
	const day = 24 * time.Hour
	for _, c := range []struct {
		topic     string
		retention time.Duration
		refused   []string // nil: started
	}{
		{quiet, 25 * time.Hour, []string{quiet, "segment.ms", "Retention"}},
		{quiet, 8 * day, nil},
		{"outbox.event.notyet", 10 * day, []string{"outbox.event.notyet", "does not exist yet", "log.roll.ms", "segment.ms"}},
		{"outbox.event.notyet2", 14 * day, nil},
	} {
		ci, err := inbox.New(inbox.Config{Postgres: e.pool, Brokers: e.kc.Addrs(), Topics: []string{c.topic}, Group: "g-" + c.topic, Retention: c.retention})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		err = ci.Run(ctx, record)
		cancel()
		switch {
		case c.refused == nil && err != nil:
			t.Errorf("%s with Retention %s: %v, want started", c.topic, c.retention, err)
		case c.refused != nil && err == nil:
			t.Errorf("%s with Retention %s: started, want refused naming %v", c.topic, c.retention, c.refused)
		case c.refused != nil:
			for _, w := range c.refused {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s with Retention %s: %v, want refused naming %q", c.topic, c.retention, err, w)
				}
			}
		}
	}
}

// TestServerRestartIsNotCountedOnAnyWorker: the server restarts while the
// handlers of two partitions run, each in its worker's transaction: the
// restart is no handler's failure on either, so with MaxAttempts 1 every
// event is handled once the server is back and none is dead-lettered.
// Before, the start time the workers compared against was the consumer's,
// one for all: the first worker to look saw the restart and recorded it,
// the second saw no change and counted a cut or a handler's fault (an
// innocent record dead-lettered, or a cut counted toward maxCuts).
func TestServerRestartIsNotCountedOnAnyWorker(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	dlq := e.collectDLQ(t)
	// Events until both partitions have one.
	parts := map[int32]bool{}
	produced := 0
	for ; len(parts) < 2 && produced < 64; produced++ {
		r := event(fmt.Sprintf("restart-%d", produced), fmt.Sprintf("order-%d", produced), 1)
		e.produce(t, r)
		parts[r.Partition] = true
	}
	if len(parts) < 2 {
		t.Fatal("no event on the second partition")
	}
	running := make(chan int32, 100)
	var restarted atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if !restarted.Load() {
			running <- m.Partition
			time.Sleep(time.Second)
		}
		return record(ctx, tx, m)
	}
	var mu sync.Mutex
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	stop := e.start(t, inbox.Config{Logger: logger, MaxAttempts: 1, BatchMaxRecords: 1, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond}, h)
	seen := map[int32]bool{}
	deadline := time.After(20 * time.Second)
	for len(seen) < 2 {
		select {
		case p := <-running:
			seen[p] = true
		case <-deadline:
			t.Fatal("the handlers of both partitions did not run")
		}
	}
	restarted.Store(true)
	if err := e.pg.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	var n int
	waitfor.Until(t, 30*time.Second, "every event handled or dead-lettered", func() bool {
		_ = e.pool.QueryRow(t.Context(), "SELECT count(DISTINCT event_id) FROM effects").Scan(&n)
		return n+len(dlq.Records()) >= produced
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, r := range dlq.Records() {
		t.Errorf("a handler whose session a server restart ended was dead-lettered: id %s, reason %s, error %s", kafkatest.Header(r, "id"), kafkatest.Header(r, sink.HeaderReason), kafkatest.Header(r, sink.HeaderError))
	}
	mu.Lock()
	defer mu.Unlock()
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `msg="the session of a transaction ended`) || strings.Contains(line, `msg="handler failed`) || strings.Contains(line, "one per transaction") {
			t.Errorf("a worker took the server's restart for a cut or a handler's fault: %s", line)
		}
	}
}

// TestAttemptCountsEveryRun: Message.Attempt counts the handler's runs
// for a record, whatever ended the runs before: a batch whose commit
// fails (a DEFERRABLE constraint one handler violated) is handled again
// one record per transaction, and each of its records' handlers runs a
// second time with Attempt 2, so that a handler with effects outside the
// transaction (an e-mail, a call) can tell a re-run. Before, the re-runs
// of that retry got Attempt 1, as if the first run had never been.
func TestAttemptCountsEveryRun(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	dlq := e.commitFault(t)
	var mu sync.Mutex
	attempts := map[string][]int{}
	h := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		mu.Lock()
		attempts[m.ID] = append(attempts[m.ID], m.Attempt)
		mu.Unlock()
		return failAtCommit(ctx, tx, m)
	}
	stop := e.start(t, inbox.Config{MaxAttempts: 2, BatchMaxTime: time.Minute, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond}, h)
	waitfor.Until(t, 15*time.Second, "the guilty event dead-lettered and the others handled", func() bool {
		return len(dlq.Records()) > 0 && e.count(t) >= 3
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts["good-1"]) < 2 {
		t.Fatalf("attempts %v: the batch was not handled again one record per transaction (the first batch did not hold every record?)", attempts)
	}
	for id, got := range attempts {
		for i, a := range got {
			if a != i+1 {
				t.Errorf("event %s: Attempt of its runs %v, want 1, 2, … (one more each run)", id, got)
				break
			}
		}
	}
}
