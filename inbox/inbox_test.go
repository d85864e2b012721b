package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/outbox"
	"github.com/walrelay/walrelay/sink"
)

const topic = "outbox.event.order"

// env is a consumer's database (with the inbox and an effects table that
// the handlers write) and a kfake cluster with the topic.
type env struct {
	pg   *pgtest.Server
	dsn  string
	pool *pgxpool.Pool
	kc   *kafkatest.Cluster
	prod *kgo.Client
}

func setup(t *testing.T, partitions int) *env {
	t.Helper()
	pg := pgtest.Start(t)
	pool, err := pgxpool.New(t.Context(), pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := inbox.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE effects (n bigserial PRIMARY KEY, event_id text NOT NULL, key text NOT NULL, seq int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var opts []kfake.Opt
	if partitions > 0 {
		opts = append(opts, kfake.SeedTopics(int32(partitions), topic))
	}
	kc := kafkatest.Start(t, opts...)
	prod, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...), kgo.DefaultProduceTopic(topic), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	return &env{pg: pg, dsn: pg.DSN, pool: pool, kc: kc, prod: prod}
}

// event is a record as walrelay writes it: key the aggregate, id and type
// headers, the value carrying the aggregate's sequence number.
func event(id, key string, seq int) *kgo.Record {
	return &kgo.Record{Key: []byte(key), Value: []byte(fmt.Sprintf(`{"seq":%d}`, seq)),
		Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(id)}, {Key: "type", Value: []byte("OrderCreated")}}}
}

func (e *env) produce(t *testing.T, rs ...*kgo.Record) {
	t.Helper()
	if err := e.prod.ProduceSync(t.Context(), rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// record is the handler of the tests: it writes one effect row in the
// transaction.
func record(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	var seq int
	if _, err := fmt.Sscanf(string(m.Value), `{"seq":%d}`, &seq); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, "INSERT INTO effects (event_id, key, seq) VALUES ($1, $2, $3)", m.ID, string(m.Key), seq)
	return err
}

// start runs a consumer of cfg (its Brokers, and its Postgres, Topics and
// Group if empty, filled in) until the returned stop is called, which returns Run's error.
func (e *env) start(t *testing.T, cfg inbox.Config, h inbox.Handler) (stop func() error) {
	t.Helper()
	if cfg.Postgres == nil {
		cfg.Postgres = e.pool
	}
	if cfg.Topics == nil {
		cfg.Topics = []string{topic}
	}
	cfg.Brokers = e.kc.Addrs()
	if cfg.Group == "" {
		cfg.Group = "shipping"
	}
	c, err := inbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(30 * time.Second):
				runErr = errors.New("Run did not return within 30 s of its context's end")
			}
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// effects returns the effect rows: how many per event id, and each key's
// sequence numbers in the order they were written.
func (e *env) effects(t *testing.T) (perID map[string]int, perKey map[string][]int) {
	t.Helper()
	rows, err := e.pool.Query(t.Context(), "SELECT event_id, key, seq FROM effects ORDER BY n")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	perID, perKey = map[string]int{}, map[string][]int{}
	for rows.Next() {
		var id, key string
		var seq int
		if err := rows.Scan(&id, &key, &seq); err != nil {
			t.Fatal(err)
		}
		perID[id]++
		perKey[key] = append(perKey[key], seq)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return perID, perKey
}

// checkOnce fails unless every id of want has exactly one effect, no other
// has any, and each key's effects are in sequence order.
func (e *env) checkOnce(t *testing.T, want map[string]bool) {
	t.Helper()
	perID, perKey := e.effects(t)
	twice, missing := 0, 0
	for id := range want {
		switch perID[id] {
		case 0:
			missing++
		case 1:
		default:
			twice++
		}
	}
	if twice > 0 || missing > 0 || len(perID) != len(want) {
		t.Fatalf("%d events: %d handled, %d twice or more, %d missing", len(want), len(perID), twice, missing)
	}
	for key, seqs := range perKey {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] <= seqs[i-1] {
				t.Fatalf("key %s handled out of order: %v", key, seqs)
			}
		}
	}
}

func (e *env) count(t *testing.T) int {
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM effects").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// collectDLQ collects the records of the inbox's dead-letter topic until
// the test ends.
func (e *env) collectDLQ(t *testing.T) *kafkatest.Collector {
	t.Helper()
	dlq, err := kafkatest.Collect(e.kc.Addrs(), `walrelay\.inbox\.dlq`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dlq.Close)
	return dlq
}

// TestEachEventOnce: 600 events on 3 partitions, 100 of them produced a
// second time at later offsets (as a relay's crash leaves them), read by a
// consumer that is stopped and started again midway: each event's effect
// is written once, in order per key, and the duplicates are counted.
func TestEachEventOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 3)
	want := map[string]bool{}
	var recs []*kgo.Record
	seq := map[string]int{}
	for i := range 600 {
		key := "order-" + strconv.Itoa(i%20)
		seq[key]++
		id := outbox.NewID()
		want[id] = true
		recs = append(recs, event(id, key, seq[key]))
	}
	e.produce(t, recs[:300]...)
	e.produce(t, recs[200:300]...) // the relay sent these again
	reg := prometheus.NewRegistry()
	stop := e.start(t, inbox.Config{Registerer: reg}, record)
	// The duplicates come after the 300 at their offsets: wait for them
	// too, or a stop after the 300th effect leaves some to the second
	// consumer.
	dups := mustVec(t, reg, "walrelay_inbox_duplicates_total")
	waitfor.Until(t, time.Minute, "the first 300 handled and the 100 duplicates skipped", func() bool {
		return e.count(t) == 300 && testutil.ToFloat64(dups) >= 100
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e.produce(t, recs[300:]...)
	e.produce(t, recs[:50]...) // and these, much later
	stop = e.start(t, inbox.Config{}, record)
	waitfor.Until(t, time.Minute, "all 600 handled", func() bool { return e.count(t) == 600 })
	time.Sleep(300 * time.Millisecond) // room for a duplicate effect
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e.checkOnce(t, want)
	if got := testutil.ToFloat64(dups); got != 100 {
		t.Fatalf("the first consumer counted %v duplicates, want 100", got)
	}
}

// mustVec returns the sum of a metric family of reg.
func mustVec(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	return gathered{reg, name}
}

// gathered is a collector of one metric family's samples, summed, for
// testutil.ToFloat64.
type gathered struct {
	reg  *prometheus.Registry
	name string
}

func (g gathered) Describe(ch chan<- *prometheus.Desc) {
	ch <- prometheus.NewDesc(g.name, "sum", nil, nil)
}

func (g gathered) Collect(ch chan<- prometheus.Metric) {
	mfs, _ := g.reg.Gather()
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != g.name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, "sum", nil, nil), prometheus.UntypedValue, sum)
}

// TestFailuresRetriedThenDeadLettered: on one partition, an event whose
// handler always fails, one that fails twice, one that panics once and a
// record without an id header: the failing one is retried MaxAttempts
// times and dead-lettered with the failure headers, the record without id
// at once; everything else is handled once, in order, after them.
func TestFailuresRetriedThenDeadLettered(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	var recs []*kgo.Record
	want := map[string]bool{}
	ids := make([]string, 40)
	for i := range ids {
		ids[i] = outbox.NewID()
		recs = append(recs, event(ids[i], "order-"+strconv.Itoa(i%4), i+1))
		want[ids[i]] = true
	}
	poison, flaky, panicky := ids[10], ids[20], ids[30]
	delete(want, poison)
	noID := event("", "order-x", 1)
	noID.Headers = noID.Headers[1:]
	recs = append(recs[:5], append([]*kgo.Record{noID}, recs[5:]...)...)
	var flakyRuns, panicRuns, poisonRuns atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		switch m.ID {
		case poison:
			poisonRuns.Add(1)
			return errors.New("payment service refused the order")
		case flaky:
			if flakyRuns.Add(1) <= 2 {
				return errors.New("try again")
			}
		case panicky:
			if panicRuns.Add(1) == 1 {
				panic("nil map")
			}
		}
		return record(ctx, tx, m)
	}
	dlq := e.collectDLQ(t)
	e.produce(t, recs...)
	stop := e.start(t, inbox.Config{MaxAttempts: 3, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond}, h)
	waitfor.Until(t, time.Minute, "39 handled", func() bool { return e.count(t) == 39 })
	dead, err := dlq.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) >= 2 })
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e.checkOnce(t, want)
	if n := poisonRuns.Load(); n != 3 {
		t.Fatalf("the failing handler ran %d times, want MaxAttempts = 3", n)
	}
	if n := len(dlq.Records()); n != 2 {
		t.Fatalf("%d dead letters, want 2", n)
	}
	byReason := map[string]*kgo.Record{}
	for _, r := range dead {
		byReason[string(kafkatest.Header(r, sink.HeaderReason))] = r
	}
	p := byReason["handler_failed"]
	if p == nil || string(kafkatest.Header(p, "id")) != poison || string(kafkatest.Header(p, sink.HeaderAttempts)) != "3" ||
		!strings.Contains(string(kafkatest.Header(p, sink.HeaderError)), "payment service refused") ||
		string(kafkatest.Header(p, sink.HeaderTopic)) != topic || string(kafkatest.Header(p, sink.HeaderPartition)) != "0" ||
		string(kafkatest.Header(p, sink.HeaderOffset)) != "11" || string(kafkatest.Header(p, sink.HeaderConsumer)) != "shipping" ||
		string(p.Value) != string(recs[11].Value) {
		t.Fatalf("the failing event's dead letter: %+v", p)
	}
	first, err1 := time.Parse(time.RFC3339Nano, string(kafkatest.Header(p, sink.HeaderFirstFailure)))
	last, err2 := time.Parse(time.RFC3339Nano, string(kafkatest.Header(p, sink.HeaderLastFailure)))
	if err1 != nil || err2 != nil || !last.After(first) {
		t.Fatalf("first and last failure: %v %v, %v %v", first, err1, last, err2)
	}
	if n := byReason["no_id"]; n == nil || string(kafkatest.Header(n, sink.HeaderOffset)) != "5" {
		t.Fatalf("the record without id: %+v", n)
	}
}

// TestHandlerErrorsOfAnyKindAreDeadLettered: handler failures that wrap
// what a broken connection wraps (io.EOF from decoding an empty payload,
// a net.Error from calling a service that is down, an error that says
// "conn closed") are the handler's, not the database's: each is tried
// MaxAttempts times and dead-lettered, and the partition goes on.
func TestHandlerErrorsOfAnyKindAreDeadLettered(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	down, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	downAddr := down.Addr().String()
	down.Close()
	var recs []*kgo.Record
	ids := make([]string, 12)
	for i := range ids {
		ids[i] = outbox.NewID()
		recs = append(recs, event(ids[i], "order-"+strconv.Itoa(i%3), i+1))
	}
	failing := map[string]func() error{
		ids[2]: func() error { var v map[string]any; return json.NewDecoder(strings.NewReader("")).Decode(&v) },
		ids[5]: func() error { _, err := net.DialTimeout("tcp", downAddr, time.Second); return err },
		ids[8]: func() error { return fmt.Errorf("call the payment service: %w", errors.New("conn closed")) },
	}
	runs := map[string]*atomic.Int32{}
	want := map[string]bool{}
	for _, id := range ids {
		runs[id] = &atomic.Int32{}
		if failing[id] == nil {
			want[id] = true
		}
	}
	h := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		runs[m.ID].Add(1)
		if f := failing[m.ID]; f != nil {
			err := f()
			if err == nil {
				t.Errorf("the failure of %s did not fail", m.ID)
			}
			return err
		}
		return record(ctx, tx, m)
	}
	dlq := e.collectDLQ(t)
	e.produce(t, recs...)
	stop := e.start(t, inbox.Config{MaxAttempts: 3, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 20 * time.Millisecond}, h)
	waitfor.Until(t, time.Minute, "9 handled", func() bool { return e.count(t) == 9 })
	if _, err := dlq.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) >= 3 }); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e.checkOnce(t, want)
	for id := range failing {
		if n := runs[id].Load(); n != 3 {
			t.Errorf("the handler of %s ran %d times, want MaxAttempts = 3", id, n)
		}
	}
	for _, r := range dlq.Records() {
		if got := string(kafkatest.Header(r, sink.HeaderReason)); got != "handler_failed" {
			t.Errorf("dead letter of %s: reason %s, want handler_failed", kafkatest.Header(r, "id"), got)
		}
	}
}

// TestRebalanceKeepsEachEventOnce: two consumers of one group share six
// partitions while events are produced; one of them stops midway (its
// partitions move to the other): each event once, in order per key.
func TestRebalanceKeepsEachEventOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 6)
	want := map[string]bool{}
	var mu sync.Mutex
	seq := map[string]int{}
	next := func() *kgo.Record {
		mu.Lock()
		defer mu.Unlock()
		key := "order-" + strconv.Itoa(len(want)%30)
		seq[key]++
		id := outbox.NewID()
		want[id] = true
		return event(id, key, seq[key])
	}
	slow := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		time.Sleep(time.Millisecond)
		return record(ctx, tx, m)
	}
	a := e.start(t, inbox.Config{BatchMaxRecords: 10}, slow)
	b := e.start(t, inbox.Config{BatchMaxRecords: 10}, slow)
	for round := range 20 {
		batch := make([]*kgo.Record, 100)
		for i := range batch {
			batch[i] = next()
		}
		e.produce(t, batch...)
		if round == 8 {
			if err := a(); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitfor.Until(t, 2*time.Minute, "2000 handled", func() bool { return e.count(t) >= 2000 })
	time.Sleep(300 * time.Millisecond)
	if err := b(); err != nil {
		t.Fatal(err)
	}
	e.checkOnce(t, want)
}

// TestPruneAndRefusals: Prune deletes only the consumer's old rows; Run
// refuses a missing inbox table and New a configuration without its
// required fields.
func TestPruneAndRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	ctx := t.Context()
	if _, err := e.pool.Exec(ctx, `INSERT INTO walrelay_inbox (consumer, event_id, processed_at)
		SELECT c, 'e' || i, now() - (i || ' hours')::interval FROM generate_series(1, 2500) i, (VALUES ('shipping'), ('billing')) v(c)`); err != nil {
		t.Fatal(err)
	}
	c, err := inbox.New(inbox.Config{Postgres: e.pool, Brokers: e.kc.Addrs(), Topics: []string{topic}, Group: "shipping"})
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.Prune(ctx, 100*time.Hour+30*time.Minute)
	if err != nil || n != 2400 {
		t.Fatalf("Prune: %d, %v; want 2400 rows deleted", n, err)
	}
	var left int
	if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM walrelay_inbox").Scan(&left); err != nil || left != 2600 {
		t.Fatalf("%d rows left, %v; want 2600", left, err)
	}

	other, err := inbox.New(inbox.Config{Postgres: e.pool, Brokers: e.kc.Addrs(), Topics: []string{topic}, Group: "g", Table: "missing_inbox"})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Run(ctx, record); err == nil || !strings.Contains(err.Error(), "walrelay migrate --inbox") {
		t.Fatalf("Run without its inbox table: %v", err)
	}
	for _, cfg := range []inbox.Config{
		{Brokers: e.kc.Addrs(), Topics: []string{topic}, Group: "g"},
		{Postgres: e.pool, Topics: []string{topic}, Group: "g"},
		{Postgres: e.pool, Brokers: e.kc.Addrs(), Group: "g"},
		{Postgres: e.pool, Brokers: e.kc.Addrs(), Topics: []string{topic}},
		{Postgres: e.pool, Brokers: e.kc.Addrs(), Topics: []string{"walrelay.inbox.dlq"}, Group: "g"},
		{Postgres: e.pool, Brokers: e.kc.Addrs(), Topics: []string{topic}, Group: "g", Retention: time.Minute},
	} {
		if _, err := inbox.New(cfg); err == nil {
			t.Fatalf("New(%+v) accepted", cfg)
		}
	}
	// The SQL path for other languages: the claim function.
	var first, again bool
	if err := e.pool.QueryRow(ctx, "SELECT walrelay_inbox_claim('billing', 'x-1'), walrelay_inbox_claim('billing', 'x-1')").Scan(&first, &again); err != nil || !first || again {
		t.Fatalf("walrelay_inbox_claim twice: %v, %v, %v", first, again, err)
	}
	var other1, other2, sameAgain bool
	if err := e.pool.QueryRow(ctx, "SELECT walrelay_inbox_claim('billing', 't1', 'x-2'), walrelay_inbox_claim('billing', 't2', 'x-2'), walrelay_inbox_claim('billing', 't1', 'x-2')").Scan(&other1, &other2, &sameAgain); err != nil || !other1 || !other2 || sameAgain {
		t.Fatalf("walrelay_inbox_claim with topics t1, t2, t1: %v, %v, %v, %v", other1, other2, sameAgain, err)
	}
}

// TestAFailingRecordBlocksOnlyItsPartition: while a record of one
// partition is being retried, the other partitions' records are all
// handled; the retried partition goes on once it is dead-lettered.
func TestAFailingRecordBlocksOnlyItsPartition(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	var recs []*kgo.Record
	want := map[string]bool{}
	for i := range 200 {
		id := outbox.NewID()
		r := event(id, "order-"+strconv.Itoa(i%10), i+1)
		r.Partition = int32(i % 2)
		recs = append(recs, r)
		want[id] = true
	}
	poison := string(kafkatest.Header(recs[4], "id")) // partition 0, early
	delete(want, poison)
	var poisonRuns atomic.Int32
	release := make(chan struct{})
	h := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if m.ID == poison {
			if poisonRuns.Add(1) == 2 {
				<-release // the second run waits until partition 1 is done
			}
			return errors.New("refused")
		}
		return record(ctx, tx, m)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(e.kc.Addrs()...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if err := prod.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	stop := e.start(t, inbox.Config{MaxAttempts: 3, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 20 * time.Millisecond}, h)
	// Partition 1's hundred, and partition 0's two before the poison, while
	// the poison's second run waits (partition 1 may finish before that
	// run starts: its first failure's back-off can outlast a hundred
	// records on an idle machine, not on a loaded one).
	waitfor.Until(t, time.Minute, "the other partition handled while the poison is retried", func() bool { return e.count(t) == 102 && poisonRuns.Load() >= 2 })
	if n := poisonRuns.Load(); n != 2 {
		t.Fatalf("the poison ran %d times, want 2 (its second run still waiting)", n)
	}
	close(release)
	waitfor.Until(t, time.Minute, "199 handled", func() bool { return e.count(t) == 199 })
	time.Sleep(300 * time.Millisecond)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e.checkOnce(t, want)
}

// TestSharedInstanceIDStops: two consumers started with one InstanceID
// (a copy-pasted name, two pods given the same one) would fence each other
// for ever, each rejoin taking the group slot from the other. The fenced
// one stops with an error naming the id, and the other goes on handling
// every event.
func TestSharedInstanceIDStops(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	const id = "shipping-0"
	cfg := inbox.Config{InstanceID: id, SessionTimeout: 6 * time.Second}
	cfg.Postgres, cfg.Brokers, cfg.Topics, cfg.Group = e.pool, e.kc.Addrs(), []string{topic}, "shipping"
	type result struct {
		name string
		err  error
	}
	done := make(chan result, 2)
	var cancels []context.CancelFunc
	run := func(name string) {
		c, err := inbox.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		go func() { done <- result{name, c.Run(ctx, record)} }()
	}
	run("a")
	e.produce(t, event(outbox.NewID(), "order-1", 1))
	waitfor.Until(t, 30*time.Second, "the first consumer handling", func() bool { return e.count(t) == 1 })
	run("b")
	var fenced result
	select {
	case fenced = <-done:
	case <-time.After(20 * time.Second):
		for _, cancel := range cancels {
			cancel()
		}
		t.Fatalf("neither consumer stopped within 20 s of the second one starting under InstanceID %s", id)
	}
	if !errors.Is(fenced.err, kerr.FencedInstanceID) || !strings.Contains(fenced.err.Error(), `"`+id+`"`) {
		t.Fatalf("consumer %s stopped with %v; want kerr.FencedInstanceID, naming %q", fenced.name, fenced.err, id)
	}
	t.Logf("consumer %s: %v", fenced.name, fenced.err)
	// The other one holds the id alone now and handles what comes.
	e.produce(t, event(outbox.NewID(), "order-1", 2))
	waitfor.Until(t, 30*time.Second, "the remaining consumer handling", func() bool { return e.count(t) == 2 })
	for _, cancel := range cancels {
		cancel()
	}
	if other := <-done; other.err != nil {
		t.Fatalf("consumer %s: %v", other.name, other.err)
	}
}

// TestSessionTimeoutRefusedStops: a SessionTimeout outside the broker's
// bounds (group.min.session.timeout.ms, 6 s by default) is refused at every
// join: Run stops with an error that says so instead of retrying for ever.
func TestSessionTimeoutRefusedStops(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	cfg := inbox.Config{SessionTimeout: 2 * time.Second, Group: "shipping"}
	if cfg.Postgres == nil {
		cfg.Postgres = e.pool
	}
	if cfg.Topics == nil {
		cfg.Topics = []string{topic}
	}
	cfg.Brokers = e.kc.Addrs()
	c, err := inbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err = c.Run(ctx, record)
	if ctx.Err() != nil {
		t.Fatalf("Run still retrying 20 s after the broker refused SessionTimeout 2s (returned %v)", err)
	}
	if !errors.Is(err, kerr.InvalidSessionTimeout) || !strings.Contains(err.Error(), "SessionTimeout 2s") {
		t.Fatalf("Run: %v; want kerr.InvalidSessionTimeout, naming SessionTimeout 2s", err)
	}
	t.Logf("Run: %v", err)
}
