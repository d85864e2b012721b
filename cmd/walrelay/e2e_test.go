package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/outbox"
)

// TestStreamsEveryEventInOrder writes 10,000 events over 100 aggregates in
// transactions of 1 to 50 rows while walrelay streams, and checks every id,
// the order per aggregate, and key, headers, value and partition of each
// record.
func TestStreamsEveryEventInOrder(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	p := streaming(t, baseEnv(pg, kc))
	w := newWriter(100, 1)
	began := time.Now()
	if err := w.write(t.Context(), conn, 10000, 50); err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, w.written(), 2*time.Minute)
	elapsed := time.Since(began)
	t.Logf("10,000 events written and delivered in %s (%.0f events/s): %s", elapsed.Round(time.Millisecond), 10000/elapsed.Seconds(), c)
	if c.duplicates != 0 || c.orderViolations != 0 || c.unexpected != 0 {
		t.Fatalf("want no duplicates, no order violations: %s", c)
	}
	var xidOK, lsnOK int
	for _, r := range col.Records() {
		if r.Topic != kc.topic("order") {
			t.Fatalf("record on topic %s", r.Topic)
		}
		if !strings.HasPrefix(string(r.Key), "agg-") || !strings.Contains(string(r.Value), `"agg": "`+string(r.Key)+`"`) {
			t.Fatalf("key %q does not match value %s", r.Key, r.Value)
		}
		if want := javaPartition(r.Key, kafkatest.Partitions); r.Partition != want {
			t.Fatalf("key %q on partition %d; the Java client's murmur2 puts it on %d", r.Key, r.Partition, want)
		}
		if got := string(kafkatest.Header(r, "type")); got != "OrderUpdated" {
			t.Fatalf("type header %q", got)
		}
		if _, err := pglogrepl.ParseLSN(string(kafkatest.Header(r, "walrelay.lsn"))); err == nil {
			lsnOK++
		}
		if x := kafkatest.Header(r, "walrelay.xid"); len(x) > 0 && x[0] != '0' {
			xidOK++
		}
		if _, err := time.Parse(time.RFC3339Nano, string(kafkatest.Header(r, "walrelay.commit_time"))); err != nil {
			t.Fatalf("commit_time header: %v", err)
		}
	}
	if lsnOK != c.records || xidOK != c.records {
		t.Fatalf("of %d records, %d have an LSN header and %d an xid header", c.records, lsnOK, xidOK)
	}
	p.signal(syscall.SIGTERM)
	if code := p.exit(30 * time.Second); code != 0 {
		t.Fatalf("SIGTERM: exit %d", code)
	}
}

// javaPartition is Kafka's DefaultPartitioner for a keyed record:
// toPositive(murmur2(key)) % partitions, written from the Java source, not
// from franz-go.
func javaPartition(key []byte, partitions int32) int32 {
	const seed, m, r = uint32(0x9747b28c), uint32(0x5bd1e995), 24
	h := seed ^ uint32(len(key))
	n := len(key) / 4
	for i := range n {
		k := uint32(key[4*i]) | uint32(key[4*i+1])<<8 | uint32(key[4*i+2])<<16 | uint32(key[4*i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	rest := key[4*n:]
	switch len(rest) {
	case 3:
		h ^= uint32(rest[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(rest[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(rest[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h&0x7fffffff) % partitions
}

// TestRollbackAndDeleteInTransaction: a rolled-back transaction's event
// never appears; a row inserted and deleted in the same transaction does.
func TestRollbackAndDeleteInTransaction(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	streaming(t, baseEnv(pg, kc))
	ctx := t.Context()
	insert := "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'a', 'T', '{}')"
	rolledBack, deleted, marker := outbox.NewID(), outbox.NewID(), outbox.NewID()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, insert, rolledBack); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err = conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, insert, deleted); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "DELETE FROM outbox WHERE id = $1", deleted); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, insert, marker); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, []string{deleted, marker}, time.Minute)
	for _, r := range col.Records() {
		if string(kafkatest.Header(r, "id")) == rolledBack {
			t.Fatalf("the rolled-back event %s was published", rolledBack)
		}
	}
}

// TestLargeTransactionStreamsInBoundedMemory sends one transaction of
// 100,000 rows through and reports walrelay's peak RSS.
func TestLargeTransactionStreamsInBoundedMemory(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	p := streaming(t, baseEnv(pg, kc))
	ctx := t.Context()
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), 'order', 'agg-' || (i % 100), 'Bulk', jsonb_build_object('agg', 'agg-' || (i % 100), 'i', i, 'pad', repeat('x', 300))
		FROM generate_series(1, 100000) AS i`); err != nil {
		t.Fatal(err)
	}
	want := committedIDs(t, conn)
	c := waitAll(t, col, want, 3*time.Minute)
	rss := p.peakRSS()
	t.Logf("one transaction of %d rows (~400 bytes each): %s; walrelay peak RSS %.1f MiB", len(want), c, float64(rss)/(1<<20))
	if c.duplicates != 0 {
		t.Fatalf("duplicates without a fault: %s", c)
	}
	limit := int64(128 << 20)
	if raceEnabled {
		limit *= 4 // the race detector's shadow memory
	}
	if rss > limit {
		t.Fatalf("peak RSS %d MiB: not bounded by the buffer limits (want under %d MiB)", rss>>20, limit>>20)
	}
}

// TestBadInputsFailClearly: each configuration mistake gives one line naming
// the problem and a non-zero exit, before anything streams.
func TestBadInputsFailClearly(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	conn := connect(t, pg.DSN)
	ctx := t.Context()
	if _, err := conn.Exec(ctx, `CREATE TABLE no_type (id uuid, aggregatetype text, aggregateid text, payload jsonb)`); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	badKey := dir + "/bad.yaml"
	writeFile(t, badKey, "kafka:\n  brokerz: [localhost:9092]\n")
	good := baseEnv(pg, kc)
	cases := []struct {
		name string
		env  env
		args []string
		want string
	}{
		{"unknown key", good, []string{"--config", badKey}, `unknown key "kafka.brokerz" (did you mean kafka.brokers?)`},
		{"bad dsn", good.with("WALRELAY_POSTGRES_DSN", "postgres://u:secret@[::1"), nil, "postgres.dsn"},
		{"unreachable host", good.with("WALRELAY_POSTGRES_DSN", "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=3"), nil, "postgres.dsn: connect"},
		{"missing table", good.with("WALRELAY_POSTGRES_TABLE", "public.nope"), nil, "table public.nope does not exist"},
		{"missing column", good.with("WALRELAY_POSTGRES_TABLE", "no_type"), nil, `table public.no_type has no column "type" (outbox.type_column)`},
		{"no brokers", good.with("WALRELAY_KAFKA_BROKERS", ""), nil, "kafka.brokers is not set"},
		// A broker that is down (refused) is waited for (TestStartWaitsForKafka); a wrong address is not.
		{"broker host unknown", good.with("WALRELAY_KAFKA_BROKERS", "nosuch-broker.invalid:9092"), nil, "kafka.brokers: reach kafka brokers nosuch-broker.invalid:9092"},
		{"bad duration", good.with("WALRELAY_KAFKA_LINGER", "soon"), nil, "WALRELAY_KAFKA_LINGER: want a duration"},
		{"bad flag value", good, []string{"--postgres.create_slot=maybe"}, "--postgres.create_slot: want true or false"},
		{"bad topic template", good.with("WALRELAY_KAFKA_TOPIC", "out box.{aggregatetype}"), nil, "topic template"},
		{"bad slot name", good.with("WALRELAY_POSTGRES_SLOT", "Bad-Slot"), nil, `slot name "Bad-Slot"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, tc.env, append([]string{"run"}, tc.args...)...)
			code := p.exit(60 * time.Second)
			out := p.out.String()
			if code == 0 {
				t.Fatalf("exit 0, want non-zero; output:\n%s", out)
			}
			last := lastLine(out)
			if !strings.HasPrefix(last, "walrelay: ") || !strings.Contains(last, tc.want) {
				t.Fatalf("last line %q, want a walrelay: line containing %q", last, tc.want)
			}
			if strings.Contains(out, "secret") {
				t.Fatalf("the password was printed:\n%s", out)
			}
		})
	}
}

// TestLogicalMessageEvents: with outbox.messages on, walrelay_emit (a
// transactional logical decoding message) publishes an event without a
// table row once its transaction commits, and never when it rolls back.
func TestLogicalMessageEvents(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc).with("WALRELAY_OUTBOX_MESSAGES", "true")
	if code, out := runCmd(t, e, "migrate"); code != 0 {
		t.Fatalf("migrate with outbox.messages: exit %d\n%s", code, out)
	}
	streaming(t, e)
	ctx := t.Context()
	emit := `SELECT walrelay_emit($1, 'invoice', 'inv-9', 'InvoiceIssued', '{"amount": 12.5}')`
	committed, rolledBack := outbox.NewID(), outbox.NewID()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, emit, rolledBack); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, emit, committed); err != nil {
		t.Fatal(err)
	}
	recs := waitAll(t, col, []string{committed}, time.Minute)
	if recs.records != 1 {
		t.Fatalf("want exactly the committed message: %s", recs)
	}
	r := col.Records()[0]
	if r.Topic != kc.topic("invoice") || string(r.Key) != "inv-9" || string(r.Value) != `{"amount": 12.5}` || string(kafkatest.Header(r, "type")) != "InvoiceIssued" {
		t.Fatalf("record %s key %q value %q", r.Topic, r.Key, r.Value)
	}
	if rows := texts(t, conn, "SELECT id::text FROM outbox"); len(rows) != 0 {
		t.Fatalf("walrelay_emit wrote rows %v, want a message", rows)
	}
}

// TestRealBrokerSmoke streams events into a real Apache Kafka broker
// (WALRELAY_TEST_KAFKA=real; the first run fetches the broker from Maven
// Central): every id arrives, keyed and partitioned as the Java client does.
// The fault suite against the real broker is still to come.
func TestRealBrokerSmoke(t *testing.T) {
	if os.Getenv(kafkatest.EnvKafka) != "real" {
		t.Skip("set " + kafkatest.EnvKafka + "=real to run against Apache Kafka " + kafkatest.KafkaVersion)
	}
	t.Parallel()
	kr := kafkatest.StartReal(t)
	pg, col := setupWith(t, kr.Addrs(), "")
	conn := connect(t, pg.DSN)
	streaming(t, env{"WALRELAY_POSTGRES_DSN": pg.DSN, "WALRELAY_KAFKA_BROKERS": strings.Join(kr.Addrs(), ","), "WALRELAY_ADMIN_LISTEN": ""})
	w := newWriter(20, 9)
	if err := w.write(t.Context(), conn, 2000, 20); err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("Apache Kafka %s: %s", kafkatest.KafkaVersion, c)
	if c.duplicates != 0 || c.orderViolations != 0 {
		t.Fatalf("want no duplicates or order violations: %s", c)
	}
	for _, r := range col.Records() {
		if want := javaPartition(r.Key, kafkatest.Partitions); r.Partition != want {
			t.Fatalf("key %q on partition %d, the Java client's is %d", r.Key, r.Partition, want)
		}
	}
}

// TestRowMappingsEndToEnd: walrelay migrate creates an outbox with a
// partition, a timestamp and a trace column (integer, timestamptz, text);
// run places each record in its row's partition, stamps it with the row's
// time, and carries the trace context on as traceparent and tracestate.
func TestRowMappingsEndToEnd(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	e := baseEnv(pg, kc).with("WALRELAY_POSTGRES_TABLE", "public.events", "WALRELAY_POSTGRES_PUBLICATION", "events_pub", "WALRELAY_POSTGRES_SLOT", "events_slot",
		"WALRELAY_OUTBOX_PARTITION_COLUMN", "shard", "WALRELAY_OUTBOX_TIMESTAMP_COLUMN", "created_at", "WALRELAY_OUTBOX_TRACE_COLUMN", "trace")
	if code, out := runCmd(t, e, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d:\n%s", code, out)
	}
	conn := connect(t, pg.DSN)
	var types string
	if err := conn.QueryRow(t.Context(), `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum) FROM pg_attribute
		WHERE attrelid = 'public.events'::regclass AND attname IN ('shard', 'created_at', 'trace')`).Scan(&types); err != nil {
		t.Fatal(err)
	}
	if types != "shard integer, created_at timestamp with time zone, trace text" {
		t.Fatalf("migrate made the columns %q", types)
	}
	// check takes the columns migrate made (before, it failed each: it
	// knew no type for the partition, timestamp and trace columns).
	if code, out := runCmd(t, e, "check"); !regexp.MustCompile(`OK +column shard +integer`).MatchString(out) ||
		!regexp.MustCompile(`OK +column created_at +timestamp with time zone`).MatchString(out) || !regexp.MustCompile(`OK +column trace +text`).MatchString(out) {
		t.Fatalf("check: exit %d:\n%s", code, out)
	}
	p := streaming(t, e)
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	at := time.Date(2026, 12, 3, 4, 5, 6, 0, time.UTC)
	var ids []string
	for i := range 40 {
		id := outbox.NewID()
		var shard, created, trace any
		if i%4 != 3 {
			shard, created, trace = i%kafkatest.Partitions, at.Add(time.Duration(i)*time.Second), "traceparent="+parent+"\ntracestate=k\\=v\n"
		}
		if _, err := conn.Exec(t.Context(), "INSERT INTO events (id, aggregatetype, aggregateid, type, payload, shard, created_at, trace) VALUES ($1, 'order', $2, 'T', '{}', $3, $4, $5)",
			id, fmt.Sprintf("o-%d", i), shard, created, trace); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	waitAll(t, col, ids, time.Minute)
	byID := map[string]*kgo.Record{}
	for _, r := range col.Records() {
		byID[string(kafkatest.Header(r, "id"))] = r
	}
	for i, id := range ids {
		r := byID[id]
		if i%4 == 3 {
			if kafkatest.Header(r, "traceparent") != nil || r.Timestamp.Equal(at.Add(time.Duration(i)*time.Second)) {
				t.Fatalf("row %d without the columns: traceparent %q, timestamp %s", i, kafkatest.Header(r, "traceparent"), r.Timestamp)
			}
			continue
		}
		if r.Partition != int32(i%kafkatest.Partitions) || !r.Timestamp.Equal(at.Add(time.Duration(i)*time.Second)) ||
			string(kafkatest.Header(r, "traceparent")) != parent || string(kafkatest.Header(r, "tracestate")) != "k=v" {
			t.Fatalf("row %d: partition %d, timestamp %s, traceparent %q, tracestate %q", i, r.Partition, r.Timestamp, kafkatest.Header(r, "traceparent"), kafkatest.Header(r, "tracestate"))
		}
	}
	p.signal(syscall.SIGTERM)
	p.exit(time.Minute)
}
