package inbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/deadletter"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/outbox"
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

// deadLetterOf waits for the dead letter of the record whose id header
// begins with prefix.
func deadLetterOf(t *testing.T, dlq *kafkatest.Collector, prefix string) *kgo.Record {
	t.Helper()
	var dl *kgo.Record
	if _, err := dlq.Wait(t.Context(), func(rs []*kgo.Record) bool {
		for _, r := range rs {
			if id := string(kafkatest.Header(r, "id")); id != "" && strings.HasPrefix(prefix, id[:min(len(id), len(prefix))]) && strings.HasPrefix(id, prefix[:min(len(id), 36)]) {
				dl = r
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatalf("no dead letter of %.40s…: %v", prefix, err)
	}
	return dl
}

// TestDeadLetterOfWideHeaders: a record whose headers alone are over the
// inbox producer's batch cap (franz-go's default, 1,000,012 bytes: the
// inbox sets none), read from a topic that allows it (max.message.bytes 4
// MiB here), that the handler fails, is dead-lettered without its value
// and without the headers over the cap, the largest first
// (walrelay.key_headers_omitted_bytes), its id, key and small headers
// kept, as the relay's sink does. Before, the consumer left out its value
// only, then retried the refusal for ever ("dead-letter topic unavailable;
// retrying"): the record after it was not handled in 20 s, the partition
// held (the review's TestProbe45InboxDeadLetterOfWideHeaders).
func TestDeadLetterOfWideHeaders(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	kc := kafkatest.Start(t, kfake.SeedTopics(1, topic), kfake.BrokerConfigs(map[string]string{"message.max.bytes": "4194304"}))
	prod, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...), kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(4<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	e.kc, e.prod = kc, prod
	dlq := e.collectDLQ(t)
	wide := event(outbox.NewID(), "order-1", 1)
	wide.Headers = append(wide.Headers, kgo.RecordHeader{Key: "baggage", Value: bytes.Repeat([]byte("b"), 1100<<10)})
	e.produce(t, wide, event(outbox.NewID(), "order-2", 2))
	e.start(t, inbox.Config{MaxAttempts: 1, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond}, refuseBaggage)
	waitfor.Until(t, 20*time.Second, "the record after one with 1.1 MB of headers handled", func() bool { return e.count(t) == 1 })
	id := string(kafkatest.Header(wide, "id"))
	dl := deadLetterOf(t, dlq, id)
	if got, want := string(kafkatest.Header(dl, sink.HeaderKeyHeadersOmitted)), fmt.Sprint(len("baggage")+1100<<10); got != want || kafkatest.Header(dl, "baggage") != nil {
		t.Errorf("%s %q, baggage %d bytes: want it left out, %s", sink.HeaderKeyHeadersOmitted, got, len(kafkatest.Header(dl, "baggage")), want)
	}
	if string(kafkatest.Header(dl, "id")) != id || string(dl.Key) != "order-1" || string(kafkatest.Header(dl, "type")) != "OrderCreated" || dl.Value != nil ||
		string(kafkatest.Header(dl, sink.HeaderReason)) != "handler_failed" || string(kafkatest.Header(dl, sink.HeaderOmitted)) != fmt.Sprint(len(wide.Value)) {
		t.Errorf("dead letter id %q key %q type %q reason %q value %d bytes (%s %q): want the id, key and type kept, handler_failed, the value left out",
			kafkatest.Header(dl, "id"), dl.Key, kafkatest.Header(dl, "type"), kafkatest.Header(dl, sink.HeaderReason), len(dl.Value), sink.HeaderOmitted, kafkatest.Header(dl, sink.HeaderOmitted))
	}
}

// refuseBaggage is a handler that fails a record with a baggage header
// and records the others.
func refuseBaggage(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	if len(m.Headers["baggage"]) > 0 {
		return errors.New("refused")
	}
	return record(ctx, tx, m)
}

// TestDeadLetterErrorClipped: a handler's error of 1.5 MB is in its dead
// letter's walrelay.error as its first bytes, "…" and its length, 1 KiB in
// all. Before, the dead letter carried it whole, over the producer's cap
// without its value too, and the consumer retried it for ever: the
// partition held.
func TestDeadLetterErrorClipped(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	dlq := e.collectDLQ(t)
	bad := event(outbox.NewID(), "order-1", 1)
	e.produce(t, bad, event(outbox.NewID(), "order-2", 2))
	long := "refused: " + strings.Repeat("e", 1500<<10)
	e.start(t, inbox.Config{MaxAttempts: 1, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond},
		func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			if string(m.Key) == "order-1" {
				return errors.New(long)
			}
			return record(ctx, tx, m)
		})
	waitfor.Until(t, 20*time.Second, "the record after one whose handler failed with 1.5 MB of error handled", func() bool { return e.count(t) == 1 })
	dl := deadLetterOf(t, dlq, string(kafkatest.Header(bad, "id")))
	got := string(kafkatest.Header(dl, sink.HeaderError))
	if len(got) > deadletter.MaxText || !strings.Contains(got, "refused: eee") || !strings.HasSuffix(got, " bytes)") || string(dl.Value) != string(bad.Value) {
		t.Errorf("%s of %d bytes %.60q…, value %q: want at most %d bytes, the error's first and its length, and the value kept", sink.HeaderError, len(got), got, dl.Value, deadletter.MaxText)
	}
}

// noise is n bytes of random base64 text.
func noise(n int) string {
	b := make([]byte, n*3/4+3)
	_, _ = rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)[:n]
}

// TestSmallestDeadLetter: on a dead-letter topic whose max.message.bytes
// (64 KiB here) is below the producer's cap, a record with a 300 KB header
// is refused by the broker with its headers; its dead letter is the
// smallest: its id, walrelay's headers and the bytes left out; one whose
// id is 100 KB too keeps the id's first 1 KiB (walrelay.id_omitted_bytes).
// The records after them are handled: a dead letter refused as too large
// is never retried as it is.
func TestSmallestDeadLetter(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	if err := e.kc.CreateTopic("walrelay.inbox.dlq", 1, map[string]string{"max.message.bytes": "65536"}); err != nil {
		t.Fatal(err)
	}
	dlq := e.collectDLQ(t)
	// Text that the producer's compression does not shrink below the
	// topic's limit.
	baggage := kgo.RecordHeader{Key: "baggage", Value: []byte(noise(300 << 10))}
	wide := event(outbox.NewID(), "order-1", 1)
	wide.Headers = append(wide.Headers, baggage)
	wideID := outbox.NewID() + noise(100<<10)
	both := withIDs("order-1", 2, wideID)
	both.Headers = append(both.Headers, baggage)
	e.produce(t, wide, both, event(outbox.NewID(), "order-2", 3))
	e.start(t, inbox.Config{MaxAttempts: 1, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond}, refuseBaggage)
	waitfor.Until(t, 20*time.Second, "the record after two dead-lettered ones handled", func() bool { return e.count(t) == 1 })
	id := string(kafkatest.Header(wide, "id"))
	dl := deadLetterOf(t, dlq, id)
	if string(kafkatest.Header(dl, "id")) != id || dl.Key != nil || kafkatest.Header(dl, "type") != nil || kafkatest.Header(dl, "baggage") != nil ||
		string(kafkatest.Header(dl, sink.HeaderKeyHeadersOmitted)) != fmt.Sprint(len("order-1")+len("typeOrderCreated")+len("baggage")+300<<10) ||
		string(kafkatest.Header(dl, sink.HeaderReason)) != "handler_failed" || string(kafkatest.Header(dl, sink.HeaderOffset)) != "0" {
		t.Errorf("dead letter id %q key %q type %q %s %q reason %q offset %q: want the id, walrelay's headers and the bytes of the key and headers left out",
			kafkatest.Header(dl, "id"), dl.Key, kafkatest.Header(dl, "type"), sink.HeaderKeyHeadersOmitted, kafkatest.Header(dl, sink.HeaderKeyHeadersOmitted),
			kafkatest.Header(dl, sink.HeaderReason), kafkatest.Header(dl, sink.HeaderOffset))
	}
	dl = deadLetterOf(t, dlq, wideID)
	got, cut := string(kafkatest.Header(dl, "id")), string(kafkatest.Header(dl, sink.HeaderIDOmitted))
	if !strings.HasPrefix(wideID, got) || len(got) > deadletter.MaxText || len(got) < deadletter.MaxText/2 || cut != fmt.Sprint(len(wideID)-len(got)) {
		t.Errorf("the wide id's dead letter: id %d bytes, %s %q: want its first bytes, at most %d, and the bytes cut", len(got), sink.HeaderIDOmitted, cut, deadletter.MaxText)
	}
}
