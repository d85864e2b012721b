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
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/sink"
)

// claimIn runs the inbox's claim call (the two-argument function of the
// first layout when topic is nil, else the three-argument one) in tx and
// sends its result on the returned channel.
func claimIn(ctx context.Context, tx pgx.Tx, topic *string, id string) <-chan claimResult {
	ch := make(chan claimResult, 1)
	go func() {
		var r claimResult
		if topic == nil {
			r.err = tx.QueryRow(ctx, "SELECT walrelay_inbox_claim('shipping', $1)", id).Scan(&r.fresh)
		} else {
			r.err = tx.QueryRow(ctx, "SELECT walrelay_inbox_claim('shipping', $1, $2)", *topic, id).Scan(&r.fresh)
		}
		ch <- r
	}()
	return ch
}

type claimResult struct {
	fresh bool
	err   error
}

// TestOldAndNewClaimsSerialize: the claim of the first layout (two
// arguments, topic ”), which services in other languages and consumers
// of the previous version call during a rolling upgrade, and the
// per-topic claim (three arguments) see each other: a claim of an event
// whose other-form claim is in flight waits for it and returns false once
// it commits (true once it rolls back), and a claim of an event the other
// form handled returns false.
func TestOldAndNewClaimsSerialize(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	tp := topic
	for _, c := range []struct {
		name          string
		first, second *string // nil: the two-argument claim
		rollback      bool
	}{
		{"old in flight, new waits", nil, &tp, false},
		{"new in flight, old waits", &tp, nil, false},
		{"old rolled back, new claims", nil, &tp, true},
		{"new rolled back, old claims", &tp, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			id := strings.ReplaceAll(c.name, " ", "-")
			first, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer first.Rollback(context.Background()) //nolint:errcheck
			if r := <-claimIn(ctx, first, c.first, id); r.err != nil || !r.fresh {
				t.Fatalf("first claim: %v %v", r.fresh, r.err)
			}
			second, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer second.Rollback(context.Background()) //nolint:errcheck
			res := claimIn(ctx, second, c.second, id)
			select {
			case r := <-res:
				t.Fatalf("the second claim returned %v %v at once while the first was in flight, want it to wait", r.fresh, r.err)
			case <-time.After(300 * time.Millisecond):
			}
			if c.rollback {
				err = first.Rollback(ctx)
			} else {
				err = first.Commit(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-res:
				if r.err != nil || r.fresh != c.rollback {
					t.Fatalf("the second claim after the first ended: %v %v, want %v", r.fresh, r.err, c.rollback)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the second claim still waits 5 s after the first ended")
			}
		})
	}
	t.Run("handled by either, claimed by the other", func(t *testing.T) {
		ctx := t.Context()
		var fresh bool
		if err := e.pool.QueryRow(ctx, "SELECT walrelay_inbox_claim('shipping', $1, 'e-2')", topic).Scan(&fresh); err != nil || !fresh {
			t.Fatalf("claim e-2: %v %v", fresh, err)
		}
		if err := e.pool.QueryRow(ctx, "SELECT walrelay_inbox_claim('shipping', 'e-3')").Scan(&fresh); err != nil || !fresh {
			t.Fatalf("claim e-3: %v %v", fresh, err)
		}
		if err := e.pool.QueryRow(ctx, "SELECT walrelay_inbox_claim('shipping', 'e-2')").Scan(&fresh); err != nil || fresh {
			t.Fatalf("the two-argument claim of e-2, handled under topic %s, returned %v %v, want false (handled twice)", topic, fresh, err)
		}
		if err := e.pool.QueryRow(ctx, "SELECT walrelay_inbox_claim('shipping', $1, 'e-3')", topic).Scan(&fresh); err != nil || fresh {
			t.Fatalf("the three-argument claim of e-3, handled by the two-argument claim, returned %v %v, want false", fresh, err)
		}
	})
}

// commitFault gives e the tables parent and child, whose foreign key is
// checked at commit, collects the dead-letter topic, and produces the
// events good-1, good-2, bad and good-3 of one key, for a handler of
// failAtCommit.
func (e *env) commitFault(t *testing.T) *kafkatest.Collector {
	t.Helper()
	if _, err := e.pool.Exec(t.Context(), `CREATE TABLE parent (id int PRIMARY KEY);
		CREATE TABLE child (id int REFERENCES parent DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	dlq := e.collectDLQ(t)
	e.produce(t, event("good-1", "order-1", 1), event("good-2", "order-1", 2), event("bad", "order-1", 3), event("good-3", "order-1", 4))
	return dlq
}

// failAtCommit is record, but the handler of the event bad also writes a
// child row without its parent, which fails the transaction at its commit.
func failAtCommit(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	if m.ID == "bad" {
		if _, err := tx.Exec(ctx, "INSERT INTO child VALUES (42)"); err != nil { // no parent 42: fails at commit
			return err
		}
	}
	return record(ctx, tx, m)
}

// TestCommitFailureCountsOnlyItsRecord: a handler whose fault surfaces
// only at the batch's commit (a DEFERRABLE INITIALLY DEFERRED constraint
// it violates) fails a transaction that other records share: the batch's
// records are then handled one per transaction to find which one it was,
// the innocent ones are handled, not counted, and only the guilty one is
// dead-lettered (MaxAttempts 1).
func TestCommitFailureCountsOnlyItsRecord(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	dlq := e.commitFault(t)
	stop := e.start(t, inbox.Config{MaxAttempts: 1, BatchMaxTime: time.Minute, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond}, failAtCommit)
	waitfor.Until(t, 15*time.Second, "the guilty event dead-lettered", func() bool {
		for _, r := range dlq.Records() {
			if string(kafkatest.Header(r, "id")) == "bad" {
				return true
			}
		}
		return false
	})
	for deadline := time.Now().Add(5 * time.Second); e.count(t) < 3 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var dead []string
	for _, r := range dlq.Records() {
		dead = append(dead, string(kafkatest.Header(r, "id"))+"/"+string(kafkatest.Header(r, sink.HeaderReason)))
	}
	if len(dead) != 1 || dead[0] != "bad/handler_failed" {
		perID, _ := e.effects(t)
		t.Fatalf("dead letters %v, want only [bad/handler_failed]; effects %v", dead, perID)
	}
	e.checkOnce(t, map[string]bool{"good-1": true, "good-2": true, "good-3": true})
}

// TestSessionCutFromOutsideIsNotCounted: a handler that does nothing
// wrong (a 400 ms unit of work, under any timeout of the session) has its
// transaction's session ended from outside while it runs
// (pg_terminate_backend by an operator) twice: that is not the handler's
// failure, so with MaxAttempts 2 the event is handled, not dead-lettered.
func TestSessionCutFromOutsideIsNotCounted(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	dlq := e.collectDLQ(t)
	e.produce(t, event("innocent", "order-1", 1))
	running := make(chan struct{}, 10)
	var mu sync.Mutex
	var runs []int
	h := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		mu.Lock()
		runs = append(runs, m.Attempt)
		mu.Unlock()
		running <- struct{}{}
		time.Sleep(400 * time.Millisecond)
		return record(ctx, tx, m)
	}
	stop := e.start(t, inbox.Config{MaxAttempts: 2, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond}, h)
	for range 2 {
		select {
		case <-running:
		case <-time.After(15 * time.Second):
			t.Fatal("the handler did not run")
		}
		time.Sleep(100 * time.Millisecond)
		if _, err := e.pool.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE state = 'idle in transaction' AND pid <> pg_backend_pid() AND datname = current_database()`); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Until(t, 15*time.Second, "handled or dead-lettered", func() bool { return e.count(t) > 0 || len(dlq.Records()) > 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := len(dlq.Records()); n > 0 {
		r := dlq.Records()[0]
		t.Fatalf("an innocent handler whose session was cut from outside twice was dead-lettered: reason %s, attempts %s, handler runs (Attempt) %v, handled %d times",
			kafkatest.Header(r, sink.HeaderReason), kafkatest.Header(r, sink.HeaderAttempts), runs, e.count(t))
	}
	e.checkOnce(t, map[string]bool{"innocent": true})
}

// TestServerRestartIsNotCounted: the server restarts while a handler
// runs (its session ends with the others): that is not the handler's
// failure, so with MaxAttempts 1 the event is handled once the server is
// back, not dead-lettered.
func TestServerRestartIsNotCounted(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	dlq := e.collectDLQ(t)
	e.produce(t, event("through-restart", "order-1", 1))
	running := make(chan struct{}, 10)
	h := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		running <- struct{}{}
		time.Sleep(300 * time.Millisecond)
		return record(ctx, tx, m)
	}
	stop := e.start(t, inbox.Config{MaxAttempts: 1, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond}, h)
	select {
	case <-running:
	case <-time.After(15 * time.Second):
		t.Fatal("the handler did not run")
	}
	if err := e.pg.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 20*time.Second, "handled or dead-lettered", func() bool {
		var n int
		_ = e.pool.QueryRow(t.Context(), "SELECT count(*) FROM effects").Scan(&n)
		return n > 0 || len(dlq.Records()) > 0
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := len(dlq.Records()); n > 0 {
		r := dlq.Records()[0]
		t.Fatalf("a handler whose session a server restart ended was dead-lettered: reason %s, error %s", kafkatest.Header(r, sink.HeaderReason), kafkatest.Header(r, sink.HeaderError))
	}
	e.checkOnce(t, map[string]bool{"through-restart": true})
}

// TestRetentionShorterThanTopicsRefused: a consumer whose inbox forgets
// events (Retention) sooner than a topic it reads keeps its records
// (retention.ms, or a compacted topic: for ever) would handle again a
// record delivered after its row was deleted: Run refuses to start and
// names the topic, the two durations and the fix; a Retention at least
// the topic's, or negative, starts.
func TestRetentionShorterThanTopicsRefused(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	for _, c := range []struct {
		name    string
		configs map[string]string
	}{
		{"outbox.event.kept90d", map[string]string{"retention.ms": "7776000000"}},
		{"outbox.event.forever", map[string]string{"retention.ms": "-1"}},
		{"outbox.event.compacted", map[string]string{"cleanup.policy": "compact"}},
	} {
		if err := e.kc.CreateTopic(c.name, 1, c.configs); err != nil {
			t.Fatal(err)
		}
	}
	run := func(tp string, retention time.Duration) error {
		c, err := inbox.New(inbox.Config{Postgres: e.pool, Brokers: e.kc.Addrs(), Topics: []string{tp}, Group: "g-" + tp, Retention: retention})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		return c.Run(ctx, record)
	}
	for _, c := range []struct {
		topic     string
		retention time.Duration
		refused   string // "" when Run must start
	}{
		{"outbox.event.kept90d", 0, "retention.ms"},
		{"outbox.event.forever", 0, "retention.ms"},
		{"outbox.event.compacted", 0, "cleanup.policy"},
		{"outbox.event.kept90d", 91 * 24 * time.Hour, "segment.ms"}, // 90 days + Kafka's default segment.ms, 7 days
		{"outbox.event.kept90d", 97 * 24 * time.Hour, ""},
		{"outbox.event.forever", -1, ""},
		{topic, 0, ""}, // kfake's defaults, retention.ms and segment.ms: 7 days each
	} {
		err := run(c.topic, c.retention)
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("%s with Retention %s: %v, want started", c.topic, c.retention, err)
		case c.refused != "" && (err == nil || !strings.Contains(err.Error(), c.refused) || !strings.Contains(err.Error(), c.topic) || !strings.Contains(err.Error(), "Retention")):
			t.Errorf("%s with Retention %s: %v, want refused naming %s", c.topic, c.retention, err, c.refused)
		}
	}
}

// TestDefaultLoggerWarnsOfDeadLetters: with no Logger the consumer logs
// to slog.Default, and dead-lettering is a WARN line with its reason.
// Before, a nil Logger discarded every line.
func TestDefaultLoggerWarnsOfDeadLetters(t *testing.T) { //nolint:paralleltest // it sets slog.Default
	var mu sync.Mutex
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil)))
	defer slog.SetDefault(prev)
	e := setup(t, 1)
	e.produce(t, withIDs("order-1", 1, "a", "b"))
	stop := e.start(t, inbox.Config{}, record)
	waitfor.Until(t, 15*time.Second, "a dead-letter line", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(buf.String(), "dead-letter")
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, line := range strings.Split(buf.String(), "\n") {
		if strings.Contains(line, "dead-letter") {
			if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "reason=several_ids") {
				t.Fatalf("the dead-letter line %q: want level WARN and the reason", line)
			}
			return
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// longID is an event id of 8,000 characters, random enough that its
// claim, an index entry, is over the server's limit of about 2.7 kB.
func longID() string {
	var raw [4000]byte
	for i := range raw {
		raw[i] = byte(i*7919%251) ^ byte(i>>3)
	}
	return fmt.Sprintf("%x", raw)
}

// TestLongIDClaimFailed (issue 48 item 2): an event whose id is 8,000
// characters (random: its claim, an index entry, is over the server's
// limit of about 2.7 kB and fails) is dead-lettered for a failure of the
// inbox's own claim, claim_failed, not handler_failed (its handler never
// ran), and the consumer's log lines quote the id bounded, never whole.
func TestLongIDClaimFailed(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	id := longID()
	var mu sync.Mutex
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	dlq := e.collectDLQ(t)
	e.produce(t, event(id, "order-1", 1))
	var ran atomic.Bool
	stop := e.start(t, inbox.Config{Logger: logger, MaxAttempts: 2, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond},
		func(context.Context, pgx.Tx, inbox.Message) error { ran.Store(true); return nil })
	dead, err := dlq.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) >= 1 })
	if err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, id) || len(line) > 2000 {
			t.Fatalf("a log line of %d bytes quotes the id %d times whole: %.300s…", len(line), strings.Count(line, id), line)
		}
	}
	if reason := string(kafkatest.Header(dead[0], sink.HeaderReason)); reason != "claim_failed" || ran.Load() {
		t.Fatalf("an event whose claim failed was dead-lettered %q (handler ran: %v), want claim_failed", reason, ran.Load())
	}
}

// TestClaimFailureBlamesItsOwnEvent: an event whose claim fails (an id too
// long for the inbox's index) right after a good event's handler ran in
// the same transaction is the one dead-lettered claim_failed; the good
// event is handled once, not counted. Before, the good event was blamed:
// with MaxAttempts 1 it was dead-lettered claim_failed, its effects rolled
// back.
func TestClaimFailureBlamesItsOwnEvent(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	id := longID()
	dlq := e.collectDLQ(t)
	e.produce(t, event("good-1", "order-1", 1), event(id, "order-1", 2))
	stop := e.start(t, inbox.Config{MaxAttempts: 1, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond}, record)
	if _, err := dlq.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) >= 1 }); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 30*time.Second, "good-1 handled", func() bool { perID, _ := e.effects(t); return perID["good-1"] == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	dead := dlq.Records()
	if len(dead) != 1 || string(kafkatest.Header(dead[0], "id")) != id || string(kafkatest.Header(dead[0], sink.HeaderReason)) != "claim_failed" {
		for _, d := range dead {
			t.Logf("dead letter id=%.20s reason=%s", kafkatest.Header(d, "id"), kafkatest.Header(d, sink.HeaderReason))
		}
		t.Fatalf("%d dead letters, want the long id's alone, claim_failed", len(dead))
	}
	if perID, _ := e.effects(t); perID["good-1"] != 1 {
		t.Fatalf("good-1 has %d effects, want 1", perID["good-1"])
	}
}
