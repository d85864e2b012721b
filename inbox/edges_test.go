package inbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/sink"
)

// withIDs is event with its id headers replaced by ids, in order.
func withIDs(key string, seq int, ids ...string) *kgo.Record {
	r := event("", key, seq)
	r.Headers = r.Headers[1:]
	for _, id := range ids {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: "id", Value: []byte(id)})
	}
	return r
}

// TestOneReadingOfTheID: a record with two id headers (walrelay's and a
// header column published as "id"), one with an id and an empty one, one
// with an empty id and one without: each is dead-lettered with its reason,
// none is handled or claimed, and the records after them are handled.
func TestOneReadingOfTheID(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	dlq := e.collectDLQ(t)
	e.produce(t,
		withIDs("order-1", 1, "evt-1", "corr-42"),
		withIDs("order-1", 2, "evt-2", "corr-42"),
		withIDs("order-1", 3, "evt-A", ""),
		withIDs("order-1", 4, ""),
		withIDs("order-1", 5),
		event("evt-6", "order-1", 6),
		event("corr-42", "order-1", 7),
	)
	var runs sync.Map
	h := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		runs.Store(m.ID, true)
		return record(ctx, tx, m)
	}
	stop := e.start(t, inbox.Config{}, h)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if _, err := dlq.Wait(ctx, func(r []*kgo.Record) bool { return len(r) >= 5 }); err != nil {
		var ran []any
		runs.Range(func(k, _ any) bool { ran = append(ran, k); return true })
		t.Fatalf("5 dead letters: %v; %d dead letters, handlers ran for %v, %d effects", err, len(dlq.Records()), ran, e.count(t))
	}
	waitfor.Until(t, 20*time.Second, "evt-6 and corr-42 handled", func() bool { return e.count(t) == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e.checkOnce(t, map[string]bool{"evt-6": true, "corr-42": true})
	want := []string{"several_ids", "several_ids", "several_ids", "empty_id", "no_id"}
	for i, r := range dlq.Records() {
		if got := string(kafkatest.Header(r, sink.HeaderReason)); i >= len(want) || got != want[i] || string(kafkatest.Header(r, sink.HeaderOffset)) != fmt.Sprint(i) {
			t.Errorf("dead letter %d: reason %q at offset %s, want %v", i, got, kafkatest.Header(r, sink.HeaderOffset), want)
		}
	}
}

// TestIDsUniquePerTopic: an inbox table of the first layout (keyed on
// consumer and event id) with a claimed event is migrated (twice: the
// migration is idempotent); then id "1" on two topics is handled twice,
// once per topic, and the event claimed before the migration is still
// skipped.
func TestIDsUniquePerTopic(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ctx := t.Context()
	if _, err := e.pool.Exec(ctx, `DROP TABLE walrelay_inbox; DROP FUNCTION IF EXISTS walrelay_inbox_claim(text, text, text);
		CREATE TABLE walrelay_inbox (consumer text NOT NULL, event_id text NOT NULL, processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (consumer, event_id));
		CREATE INDEX walrelay_inbox_processed_at ON walrelay_inbox (consumer, processed_at);
		INSERT INTO walrelay_inbox (consumer, event_id) VALUES ('shipping', 'old-1')`); err != nil {
		t.Fatal(err)
	}
	old, err := inbox.New(inbox.Config{Postgres: e.pool, Brokers: e.kc.Addrs(), Topics: []string{topic}, Group: "shipping"})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := old.Run(rctx, record); err == nil || !strings.Contains(err.Error(), "earlier layout") {
		t.Fatalf("Run on an inbox table not migrated: %v, want refused", err)
	}
	for range 2 {
		if err := inbox.Migrate(ctx, e.pool); err != nil {
			t.Fatal(err)
		}
	}
	const other = "outbox.event.invoice"
	e.produce(t, event("old-1", "order-1", 1), event("1", "order-1", 2))
	if err := e.prod.ProduceSync(ctx, &kgo.Record{Topic: other, Key: []byte("invoice-1"), Value: []byte(`{"seq":1}`),
		Headers: []kgo.RecordHeader{{Key: "id", Value: []byte("1")}}}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	stop := e.start(t, inbox.Config{Topics: []string{topic, other}}, record)
	waitfor.Until(t, 20*time.Second, "two events handled", func() bool { return e.count(t) >= 2 })
	time.Sleep(300 * time.Millisecond) // room for old-1, wrongly handled
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	perID, _ := e.effects(t)
	if perID["1"] != 2 || perID["old-1"] != 0 {
		t.Fatalf("effects per id %v, want id 1 twice (once per topic) and old-1 (claimed before the migration) never", perID)
	}
}

// TestHandlerKillingItsConnectionIsCounted: a handler that outlives
// idle_in_transaction_session_timeout and one that ends its own backend
// fail as the database connection does, after they ran. The first is the
// handler's doing by the timeout: each run counts an attempt, and with
// MaxAttempts 2 it is dead-lettered after two runs. The second looks like
// a session ended from outside (pg_terminate_backend by an operator is
// the same to the client), which is not counted: it is retried up to the
// bound of such cuts in a row (10), then dead-lettered, not retried for
// ever.
func TestHandlerKillingItsConnectionIsCounted(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	pcfg, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "300"
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	dlq := e.collectDLQ(t)
	e.produce(t, event("slow", "order-1", 1), event("suicide", "order-1", 2), event("fine", "order-1", 3))
	var mu sync.Mutex
	attempts := map[string][]int{}
	h := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		mu.Lock()
		attempts[m.ID] = append(attempts[m.ID], m.Attempt)
		mu.Unlock()
		switch m.ID {
		case "slow":
			time.Sleep(700 * time.Millisecond)
		case "suicide":
			if _, err := tx.Exec(ctx, "SELECT pg_terminate_backend(pg_backend_pid())"); err != nil {
				return err
			}
		}
		return record(ctx, tx, m)
	}
	stop := e.start(t, inbox.Config{Postgres: pool, MaxAttempts: 2, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond}, h)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	_, err = dlq.Wait(ctx, func(r []*kgo.Record) bool { return len(r) >= 2 })
	mu.Lock()
	seen := fmt.Sprint(attempts)
	mu.Unlock()
	if err != nil {
		t.Fatalf("no two dead letters in 15 s (%v); handler runs and their Attempt: %s", err, seen)
	}
	waitfor.Until(t, 10*time.Second, "fine handled", func() bool { return e.count(t) == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]string{"slow": "[1 2]", "suicide": "[1 2 3 4 5 6 7 8 9 10]"}
	for id, runs := range want {
		if fmt.Sprint(attempts[id]) != runs {
			t.Errorf("%s: runs with Attempt %v, want %s", id, attempts[id], runs)
		}
	}
	for _, r := range dlq.Records() {
		if string(kafkatest.Header(r, sink.HeaderReason)) != "handler_failed" ||
			string(kafkatest.Header(r, sink.HeaderAttempts)) != fmt.Sprint(len(attempts[string(kafkatest.Header(r, "id"))])) {
			t.Errorf("dead letter of %s: reason %s, attempts %s", kafkatest.Header(r, "id"), kafkatest.Header(r, sink.HeaderReason), kafkatest.Header(r, sink.HeaderAttempts))
		}
	}
	e.checkOnce(t, map[string]bool{"fine": true})
}

// TestHandlerIgnoringItsContextDoesNotHoldTheStop: a handler that ignores
// its context's end does not hold a stop (or a rebalance) beyond
// ShutdownTimeout and a short grace: its transaction's backend is ended,
// so the event's claim is released, the offset is not committed, and
// the next consumer of the partition handles the event, once.
func TestHandlerIgnoringItsContextDoesNotHoldTheStop(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produce(t, event("stuck", "order-1", 1), event("after", "order-1", 2))
	release := make(chan struct{})
	defer close(release)
	var entered atomic.Bool
	stuck := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if m.ID == "stuck" {
			entered.Store(true)
			<-release // ignores ctx
		}
		return record(ctx, tx, m)
	}
	stop := e.start(t, inbox.Config{ShutdownTimeout: 300 * time.Millisecond}, stuck)
	waitfor.Until(t, 20*time.Second, "the handler entered", entered.Load)
	began := time.Now()
	err := stop()
	if took := time.Since(began); err != nil || took > 5*time.Second {
		t.Fatalf("Run returned %v after %s, want nil within 5 s", err, took.Round(time.Millisecond))
	}
	stop = e.start(t, inbox.Config{}, record)
	waitfor.Until(t, 20*time.Second, "both handled by the next consumer", func() bool { return e.count(t) == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e.checkOnce(t, map[string]bool{"stuck": true, "after": true})
}

// TestRetentionPrunesByDefault: with no setting, a running consumer
// deletes its inbox rows older than the default Retention (30 days), not
// the newer ones nor another consumer's.
func TestRetentionPrunesByDefault(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	if _, err := e.pool.Exec(t.Context(), `INSERT INTO walrelay_inbox (consumer, event_id, processed_at)
		SELECT c, 'e' || i, now() - (i || ' days')::interval FROM generate_series(1, 40) i, (VALUES ('shipping'), ('billing')) v(c)`); err != nil {
		t.Fatal(err)
	}
	stop := e.start(t, inbox.Config{}, record)
	left := func() (n int) {
		if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM walrelay_inbox WHERE consumer = 'shipping'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(10 * time.Second)
	for left() != 29 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var billing int
	if err := e.pool.QueryRow(t.Context(), "SELECT count(*) FROM walrelay_inbox WHERE consumer = 'billing'").Scan(&billing); err != nil {
		t.Fatal(err)
	}
	if n := left(); n != 29 || billing != 40 {
		t.Fatalf("%d rows of the consumer left, %d of another; want 29 (those of the last 30 days) and 40", n, billing)
	}
}
