package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/internal/kafkatest"
	"github.com/walrelay/walrelay/internal/pgtest"
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

// TestSurvivesSIGKILL kills walrelay at random moments mid-stream, three
// times, while rows are written without pause, and then lets it finish:
// every committed id arrives.
func TestSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	w := newWriter(50, 2)
	w.bytes = 200
	stop := w.keepWriting(t.Context(), pg.DSN)
	rng := rand.New(rand.NewPCG(3, 3))
	e := baseEnv(pg, kc)
	for i := range 3 {
		p := streaming(t, e)
		time.Sleep(time.Duration(200+rng.IntN(2300)) * time.Millisecond)
		p.kill()
		t.Logf("kill %d: %d rows written, %d records so far, slot confirmed at %s", i+1, len(w.written()), len(col.Records()), slotConfirmed(t, conn, "walrelay"))
	}
	streaming(t, e)
	if n := stop(); n != 0 {
		t.Fatalf("%d writes failed", n)
	}
	want := committedIDs(t, conn)
	c := waitAll(t, col, want, 2*time.Minute)
	t.Logf("after 3 SIGKILLs: rows committed %d, %s", len(want), c)
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
}

// TestCleanStopPublishesNothingTwice stops walrelay with SIGTERM mid-stream
// and starts it again: every event arrives exactly once.
func TestCleanStopPublishesNothingTwice(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	w := newWriter(20, 4)
	w.bytes = 100
	writeErr := make(chan error, 1)
	go func() { writeErr <- w.write(context.Background(), conn, 20000, 50) }()
	e := baseEnv(pg, kc)
	for range 2 {
		p := streaming(t, e)
		time.Sleep(700 * time.Millisecond)
		p.signal(syscall.SIGTERM)
		if code := p.exit(40 * time.Second); code != 0 {
			t.Fatalf("SIGTERM: exit %d", code)
		}
		if !strings.Contains(p.out.String(), "msg=stopped") {
			t.Fatalf("no clean stop logged")
		}
	}
	streaming(t, e)
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("after two SIGTERM restarts: %s", c)
	if c.duplicates != 0 || c.orderViolations != 0 {
		t.Fatalf("a clean stop published events twice: %s", c)
	}
}

// TestKafkaOutage takes the broker off the network for 10 s mid-stream:
// walrelay does not confirm what Kafka did not acknowledge, resumes by
// itself, and nothing is lost.
func TestKafkaOutage(t *testing.T) {
	t.Parallel()
	_, col, fk, conn, w := warmStream(t, 5, 2000)
	fk.Down()
	if err := w.write(t.Context(), conn, 3000, 20); err != nil {
		t.Fatal(err)
	}
	waitSent(t, conn) // walrelay has read what it cannot publish
	before := slotConfirmed(t, conn, "walrelay")
	time.Sleep(7 * time.Second)
	after := slotConfirmed(t, conn, "walrelay")
	if before != after {
		t.Fatalf("confirmed_flush_lsn moved from %s to %s while Kafka was unreachable", before, after)
	}
	var end string
	if err := conn.QueryRow(t.Context(), "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
		t.Fatal(err)
	}
	fk.Up()
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("after a 10 s Kafka outage: %s (slot held at %s during it)", c, before)
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
	waitConfirmedPast(t, conn, end)
}

// TestBrokerDownWhileWriting takes the broker down, briefly and again and
// again, while rows are written without pause: the client fails records of a
// partition it cannot reach while walrelay is still producing to it, and
// none of what walrelay produced after the failure may reach the topic before
// the failed record is sent again.
func TestBrokerDownWhileWriting(t *testing.T) {
	t.Parallel()
	pg, col, fk, _, w := warmStream(t, 6, 500)
	stop := w.keepWriting(t.Context(), pg.DSN)
	for range 5 {
		time.Sleep(time.Second)
		fk.Down()
		time.Sleep(2 * time.Second)
		fk.Up()
	}
	time.Sleep(time.Second)
	if n := stop(); n != 0 {
		t.Fatalf("%d writes failed", n)
	}
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("five 2 s outages while writing: %s", c)
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
}

// warmStream is the start of a broker fault test: walrelay streaming, the
// switches of its network to the broker, and rows written (30 aggregates,
// transactions of up to 20 rows) until all of them arrived.
func warmStream(t *testing.T, seed uint64, rows int) (*pgtest.Server, *kafkatest.Collector, kafkatest.Network, *pgx.Conn, *writer) {
	t.Helper()
	pg, kc, col := setup(t)
	fk := kc.net(t)
	conn := connect(t, pg.DSN)
	streaming(t, baseEnv(pg, kc))
	w := newWriter(30, seed)
	if err := w.write(t.Context(), conn, rows, 20); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	return pg, col, fk, conn, w
}

// waitConfirmedPast waits until the slot confirmed at least lsn: every
// event before it is acknowledged, and the position reached the server.
func waitConfirmedPast(t *testing.T, conn *pgx.Conn, lsn string) {
	t.Helper()
	want, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, _ := pglogrepl.ParseLSN(slotConfirmed(t, conn, "walrelay"))
		if got >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot confirmed %s, want at least %s", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestPostgresRestart restarts PostgreSQL mid-stream: walrelay reconnects
// and resumes with nothing lost. PostgreSQL 15 does not save a slot's
// confirmed position at shutdown, so the restarted slot is behind what
// walrelay confirmed; walrelay resumes from its own position (same server,
// same timeline) instead of taking every event since the slot's last save
// again.
func TestPostgresRestart(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	needThrowaway(t, pg, "restarts the server")
	conn := connect(t, pg.DSN)
	p := streaming(t, baseEnv(pg, kc))
	w := newWriter(30, 6)
	if err := w.write(t.Context(), conn, 3000, 30); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	if err := pg.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	conn2 := connect(t, pg.DSN)
	if err := w.write(t.Context(), conn2, 3000, 30); err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("after a PostgreSQL restart: %s", c)
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
	// Every event before the restart was acknowledged before it, so none
	// should come again; a few would be a late ack, 3,000 the slot's
	// position.
	if c.duplicates > 300 {
		t.Fatalf("the restart resent events confirmed before it: %s", c)
	}
	if !strings.Contains(p.out.String(), "reconnecting") {
		t.Fatalf("walrelay did not log a reconnect")
	}
}

// TestRestoredServerResumesFromItsSlot: the server's data directory is put
// back to a copy taken earlier (a disk snapshot restored, say) while
// walrelay runs. Same system identifier, same timeline, but the WAL that
// walrelay confirmed positions in is gone, and new transactions reuse those
// positions. walrelay must resume from the restored slot's position, not
// from its own (which would skip the new transactions): every row written
// after the restore arrives.
func TestRestoredServerResumesFromItsSlot(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	needThrowaway(t, pg, "restores the server's files")
	ctx := t.Context()
	p := streaming(t, baseEnv(pg, kc))
	w := newWriter(30, 7)
	if err := w.write(ctx, connect(t, pg.DSN), 1000, 10); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	restore, err := pg.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	// WAL that will be gone: walrelay confirms positions past the copy.
	conn := connect(t, pg.DSN)
	if err := w.write(ctx, conn, 3000, 10); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	confirmedBefore := slotConfirmed(t, conn, "walrelay")
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := restore(ctx); err != nil {
		t.Fatal(err)
	}
	// walrelay reconnects before the restored server writes past its
	// position (see the README's Limits for the case where it does not).
	sessions := strings.Count(p.out.String(), "msg=streaming")
	if err := pg.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); strings.Count(p.out.String(), "msg=streaming") == sessions; {
		if time.Now().After(deadline) {
			t.Fatal("walrelay did not stream from the restored server within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn = connect(t, pg.DSN)
	if err := w.write(ctx, conn, 300, 10); err != nil {
		t.Fatal(err)
	}
	var restoredEnd string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&restoredEnd); err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, w.written(), time.Minute)
	t.Logf("confirmed %s before the restore; the restored server's WAL ends at %s after 300 new rows: %s", confirmedBefore, restoredEnd, c)
	if !strings.Contains(p.out.String(), "WAL history is not the one") {
		t.Fatalf("walrelay did not say that it resumed from the slot's position")
	}
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
	rolledBack, deleted, marker := newUUID(), newUUID(), newUUID()
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

// TestNullAggregateIDIsDeadLettered: a row whose aggregateid is NULL goes to
// the dead-letter topic with its id, position, table and error; the stream
// goes on.
func TestNullAggregateIDIsDeadLettered(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	ctx := t.Context()
	// An application's own table, without the NOT NULL of the migrated one.
	if _, err := conn.Exec(ctx, `CREATE TABLE app_outbox (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb)`); err != nil {
		t.Fatal(err)
	}
	e := baseEnv(pg, kc).with("WALRELAY_POSTGRES_TABLE", "public.app_outbox", "WALRELAY_POSTGRES_SLOT", "app", "WALRELAY_POSTGRES_PUBLICATION", "app_pub")
	streaming(t, e)
	bad, good := newUUID(), newUUID()
	if _, err := conn.Exec(ctx, `INSERT INTO app_outbox VALUES ($1, 'order', NULL, 'T', '{"n": 1}')`, bad); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO app_outbox VALUES ($1, 'order', 'a1', 'T', '{"n": 2}')`, good); err != nil {
		t.Fatal(err)
	}
	recs, err := col.Wait(ctx, func(recs []*kgo.Record) bool { return len(recs) >= 2 })
	if err != nil {
		t.Fatal(err)
	}
	var dlq, ok *kgo.Record
	for _, r := range recs {
		switch string(kafkatest.Header(r, "id")) {
		case bad:
			dlq = r
		case good:
			ok = r
		}
	}
	if dlq == nil || dlq.Topic != kc.dlq() {
		t.Fatalf("the NULL-key row is not on walrelay.dlq: %v", dlq)
	}
	if ok == nil || ok.Topic != kc.topic("order") {
		t.Fatalf("the row after it did not arrive on its topic")
	}
	if got := string(kafkatest.Header(dlq, "walrelay.error")); !strings.Contains(got, "aggregateid is NULL") {
		t.Fatalf("dead-letter error header %q", got)
	}
	if got := string(kafkatest.Header(dlq, "walrelay.table")); got != "public.app_outbox" {
		t.Fatalf("dead-letter table header %q", got)
	}
	if _, err := pglogrepl.ParseLSN(string(kafkatest.Header(dlq, "walrelay.lsn"))); err != nil {
		t.Fatalf("dead-letter lsn header: %v", err)
	}
	if string(dlq.Value) != `{"n": 1}` {
		t.Fatalf("dead-letter value %q", dlq.Value)
	}
}

// TestOversizedPayloadIsDeadLettered: a record over the batch limit goes to
// the dead-letter topic (without its value, which is too large there too),
// and the next event arrives.
func TestOversizedPayloadIsDeadLettered(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	streaming(t, baseEnv(pg, kc).with("WALRELAY_KAFKA_BATCH_MAX_BYTES", "20000"))
	ctx := t.Context()
	big, next := newUUID(), newUUID()
	insert := "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'a', 'T', $2)"
	if _, err := conn.Exec(ctx, insert, big, fmt.Sprintf(`{"blob": %q}`, strings.Repeat("y", 50000))); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, insert, next, `{}`); err != nil {
		t.Fatal(err)
	}
	recs, err := col.Wait(ctx, func(recs []*kgo.Record) bool { return len(recs) >= 2 })
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		switch id := string(kafkatest.Header(r, "id")); {
		case id == big && r.Topic == kc.dlq():
			if string(kafkatest.Header(r, "walrelay.reason")) != "too_large" || kafkatest.Header(r, "walrelay.payload_omitted_bytes") == nil {
				t.Fatalf("dead-letter headers %v", r.Headers)
			}
		case id == next && r.Topic == kc.topic("order"):
		default:
			t.Fatalf("unexpected record %s on %s", id, r.Topic)
		}
	}
}

// TestSecondInstanceWaitsForTheSlot: a second walrelay on the same slot
// waits, naming the pid that holds it, and takes over when the first dies.
func TestSecondInstanceWaitsForTheSlot(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	first := streaming(t, e)
	second := start(t, e, "run")
	second.waitLog("slot is active in another process", 30*time.Second)
	first.kill()
	killed := time.Now()
	second.waitLog("msg=streaming", 30*time.Second)
	takeover := time.Since(killed)
	// No bound but waitLog's: the standby asks every second at most, and
	// a loaded machine may take longer; the figure is logged.
	t.Logf("the standby streamed %s after the first instance was killed", takeover.Round(10*time.Millisecond))
	w := newWriter(5, 7)
	if err := w.write(t.Context(), conn, 100, 10); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
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
		{"broker down", good.with("WALRELAY_KAFKA_BROKERS", "127.0.0.1:1"), nil, "kafka.brokers: reach kafka brokers 127.0.0.1:1"},
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

// TestIdleOutboxDoesNotHoldWAL: with the outbox idle and another table of
// the same database busy, the keepalive advance moves the slot along with the
// WAL while it is written, and to the end after, so the disk does not fill
// with WAL the slot no longer needs. The lag while writing is about the WAL
// rate times the status interval (1 s here), so the test asserts that the
// slot follows, not a lag figure that depends on how fast this machine
// writes (100 to 320 MiB/s here): the slot must pass 100 MiB of another
// table's WAL before 1 GiB is written.
func TestIdleOutboxDoesNotHoldWAL(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	conn := connect(t, pg.DSN)
	streaming(t, baseEnv(pg, kc))
	ctx := t.Context()
	if _, err := conn.Exec(ctx, "CREATE TABLE busy (id bigserial PRIMARY KEY, pad text)"); err != nil {
		t.Fatal(err)
	}
	// position returns the server's WAL position and the slot's confirmed
	// one, in bytes.
	position := func() (current, confirmed int64) {
		if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0', confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = 'walrelay'`).Scan(&current, &confirmed); err != nil {
			t.Fatal(err)
		}
		return current, confirmed
	}
	start, _ := position()
	began := time.Now()
	var worst int64
	for {
		if _, err := conn.Exec(ctx, "INSERT INTO busy (pad) SELECT repeat('z', 1000) FROM generate_series(1, 1000)"); err != nil {
			t.Fatal(err)
		}
		current, confirmed := position()
		worst = max(worst, current-confirmed)
		if confirmed-start >= 100<<20 {
			t.Logf("the slot followed 100 MiB of another table's WAL while %d MiB were written at %.0f MiB/s; lag at most %.1f MiB",
				(current-start)>>20, float64(current-start)/(1<<20)/time.Since(began).Seconds(), float64(worst)/(1<<20))
			break
		}
		if current-start >= 1<<30 {
			t.Fatalf("the slot moved %d MiB while %d MiB of WAL went to another table", (confirmed-start)>>20, (current-start)>>20)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		current, confirmed := position()
		if lag := current - confirmed; lag < 1<<20 {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("the slot still lags %d bytes behind an idle outbox", lag)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestHeartbeatIsWrittenAndNotPublished: with heartbeat.interval set,
// walrelay writes heartbeat messages into the WAL, reads them back through
// the slot and publishes none of them. (On this server the keepalive advance
// alone keeps the slot moving when only another database writes, as
// TestIdleOutboxDoesNotHoldWAL shows for another table; the heartbeat is for
// setups where keepalives do not carry the WAL end forward, and costs one tiny
// WAL record per interval.)
func TestHeartbeatIsWrittenAndNotPublished(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	admin := freeAddr(t)
	streaming(t, baseEnv(pg, kc).with("WALRELAY_HEARTBEAT_INTERVAL", "100ms", "WALRELAY_ADMIN_LISTEN", admin))
	deadline := time.Now().Add(20 * time.Second)
	for {
		beats, _ := metricValue(httpGet(t, "http://"+admin+"/metrics"), `walrelay_changes_ignored_total{kind="heartbeat"}`)
		if beats >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v heartbeats came back through the slot in 20 s, want at least 5", beats)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := len(col.Records()); n != 0 {
		t.Fatalf("%d records published from heartbeats", n)
	}
}

// TestLostSlotStopsWithAnExplanation: a slot the server invalidated
// (wal_status lost) stops walrelay with what happened and how to recover.
func TestLostSlotStopsWithAnExplanation(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	needThrowaway(t, pg, "changes server settings")
	conn := connect(t, pg.DSN)
	ctx := t.Context()
	for _, sql := range []string{
		"ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "ALTER SYSTEM SET max_wal_size = '32MB'", "ALTER SYSTEM SET min_wal_size = '32MB'",
		"SELECT pg_reload_conf()",
		"CREATE TABLE busy AS SELECT repeat('z', 1000) AS pad FROM generate_series(1, 80000)",
		"SELECT pg_switch_wal()", "CHECKPOINT",
		"INSERT INTO busy SELECT repeat('y', 1000) FROM generate_series(1, 80000)",
		"SELECT pg_switch_wal()", "CHECKPOINT",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	var status string
	if err := conn.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'walrelay'").Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "lost" {
		t.Fatalf("could not invalidate the slot for the test: wal_status %s", status)
	}
	code, out := runCmd(t, baseEnv(pg, kc), "run")
	if code == 0 || !strings.Contains(out, "was invalidated (wal_status lost)") || !strings.Contains(out, "recreate the slot") {
		t.Fatalf("exit %d, want the invalidated-slot explanation:\n%s", code, tail(out, 2000))
	}
}

// TestLogicalMessageEvents: walrelay_emit (a transactional logical decoding
// message) publishes an event without a table row once its transaction
// commits, and never when it rolls back.
func TestLogicalMessageEvents(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	streaming(t, baseEnv(pg, kc))
	ctx := t.Context()
	emit := `SELECT walrelay_emit($1, 'invoice', 'inv-9', 'InvoiceIssued', '{"amount": 12.5}')`
	committed, rolledBack := newUUID(), newUUID()
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

// TestReplicationConnectionCut cuts walrelay's connections to PostgreSQL
// (through a TCP proxy) twice mid-stream: it reconnects and nothing is lost.
func TestReplicationConnectionCut(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	px, dsn := pgProxy(t, pg)
	conn := connect(t, pg.DSN)
	p := streaming(t, baseEnv(pg, kc).with("WALRELAY_POSTGRES_DSN", dsn))
	w := newWriter(30, 10)
	writeErr := make(chan error, 1)
	go func() { writeErr <- w.write(context.Background(), conn, 20000, 20) }()
	for range 2 {
		time.Sleep(700 * time.Millisecond)
		px.Cut()
	}
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("after two cuts of the replication connection: %s", c)
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
	if !strings.Contains(p.out.String(), "reconnecting") {
		t.Fatal("walrelay did not log a reconnect")
	}
}

// TestPausedPastSenderTimeout stops walrelay with SIGSTOP for longer than
// wal_sender_timeout: the server ends the session; after SIGCONT walrelay
// reconnects and nothing is lost.
func TestPausedPastSenderTimeout(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	needThrowaway(t, pg, "changes server settings")
	conn := connect(t, pg.DSN)
	ctx := t.Context()
	for _, sql := range []string{"ALTER SYSTEM SET wal_sender_timeout = '2s'", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	p := streaming(t, baseEnv(pg, kc))
	w := newWriter(30, 11)
	if err := w.write(ctx, conn, 2000, 20); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	p.signal(syscall.SIGSTOP)
	if err := w.write(ctx, conn, 2000, 20); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // past wal_sender_timeout: the server gives up on the session
	var senders int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication").Scan(&senders); err != nil {
		t.Fatal(err)
	}
	p.signal(syscall.SIGCONT)
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("after a pause past wal_sender_timeout (walsenders left during it: %d): %s", senders, c)
	if senders != 0 {
		t.Fatalf("the server kept the paused session (%d walsenders): the pause did not pass wal_sender_timeout", senders)
	}
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
}

// TestUnwritableDeadLetterTopicStops: when the dead-letter topic refuses the
// record too, walrelay stops with an error naming the event, and the slot
// does not move past it.
func TestUnwritableDeadLetterTopicStops(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	conn := connect(t, pg.DSN)
	ctx := t.Context()
	if _, err := conn.Exec(ctx, `CREATE TABLE app_outbox (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb)`); err != nil {
		t.Fatal(err)
	}
	e := baseEnv(pg, kc).with("WALRELAY_POSTGRES_TABLE", "public.app_outbox", "WALRELAY_POSTGRES_SLOT", "app", "WALRELAY_POSTGRES_PUBLICATION", "app_pub")
	p := streaming(t, e)
	before := slotConfirmed(t, conn, "app")
	// From now on the broker refuses every produce: the only one is the
	// dead-letter record of the row below.
	fk := kc.fake(t)
	fk.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		fk.KeepControl()
		return kafkatest.RefuseProduce(req.(*kmsg.ProduceRequest), kerr.TopicAuthorizationFailed.Code), nil, true
	})
	bad := newUUID()
	if _, err := conn.Exec(ctx, `INSERT INTO app_outbox VALUES ($1, 'order', NULL, 'T', '{}')`, bad); err != nil {
		t.Fatal(err)
	}
	if code := p.exit(60 * time.Second); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if out := p.out.String(); !strings.Contains(out, "dead-letter event "+bad) || !strings.Contains(out, "TOPIC_AUTHORIZATION_FAILED") {
		t.Fatalf("the error does not name the event and the refusal:\n%s", tail(out, 2000))
	}
	// The slot may have moved over WAL before the row (a keepalive while
	// nothing was in flight), never past the row's transaction.
	if !pendingChanges(t, conn, "app", "app_pub") {
		t.Fatalf("the slot moved from %s to %s, past an event that reached no topic", before, slotConfirmed(t, conn, "app"))
	}
}

// TestRefusedProduceWhileWriting has a healthy broker refuse one produce
// request with a non-retriable error, eight times, while rows are written
// without pause: the client fails that partition's records while walrelay
// is still producing, and what walrelay produced meanwhile must not reach
// the topic ahead of the failed records' resend (kfake only: it needs the
// broker to answer with an error).
func TestRefusedProduceWhileWriting(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	p := streaming(t, baseEnv(pg, kc))
	fk := kc.fake(t)
	w := newWriter(30, 21)
	stop := w.keepWriting(t.Context(), pg.DSN)
	for range 8 {
		time.Sleep(700 * time.Millisecond)
		fk.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
			return kafkatest.RefuseProduce(req.(*kmsg.ProduceRequest), kerr.UnknownServerError.Code), nil, true
		})
	}
	time.Sleep(700 * time.Millisecond)
	if n := stop(); n != 0 {
		t.Fatalf("%d writes failed", n)
	}
	c := waitAll(t, col, w.written(), 2*time.Minute)
	out := p.out.String()
	restarts, breaks := strings.Count(out, "replication stream failed"), strings.Count(out, "written ahead of an earlier event")
	t.Logf("8 produce requests refused with UNKNOWN_SERVER_ERROR while writing: %d restarts, %d order breaks logged, %s", restarts, breaks, c)
	if restarts < 4 {
		t.Fatalf("only %d restarts: the refusals did not fail records mid-stream", restarts)
	}
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
}

// TestRetriableBrokerErrors: the broker answers produce requests with
// NOT_LEADER_FOR_PARTITION and REQUEST_TIMED_OUT for a while; the events are
// retried, none is dropped, and the order per key holds.
func TestRetriableBrokerErrors(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	streaming(t, baseEnv(pg, kc))
	w := newWriter(20, 12)
	if err := w.write(t.Context(), conn, 500, 10); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	var injected atomic.Int64
	codes := []int16{kerr.NotLeaderForPartition.Code, kerr.RequestTimedOut.Code}
	fk := kc.fake(t)
	fk.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		n := injected.Add(1)
		if n > 6 {
			return nil, nil, false // from now on the broker answers normally
		}
		fk.KeepControl()
		return kafkatest.RefuseProduce(req.(*kmsg.ProduceRequest), codes[n%2]), nil, true
	})
	if err := w.write(t.Context(), conn, 3000, 10); err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("after %d produce requests answered with retriable errors: %s", min(injected.Load(), 6), c)
	if injected.Load() < 6 {
		t.Fatalf("only %d produce requests were refused; the test injected too little", injected.Load())
	}
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
}

// TestKilledBetweenAckAndConfirm kills walrelay (a build with the
// faultinject hook) right after Kafka acknowledged an event and before the
// checkpoint heard of it, three times: the events Kafka has but PostgreSQL
// was never told of come again, and nothing is lost.
func TestKilledBetweenAckAndConfirm(t *testing.T) {
	t.Parallel()
	bin, err := faultBin()
	if err != nil {
		t.Fatal(err)
	}
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	w := newWriter(20, 13)
	if err := w.write(t.Context(), conn, 6000, 20); err != nil {
		t.Fatal(err)
	}
	for i, after := range []string{"500", "1700", "2900"} {
		p := startBin(t, bin, baseEnv(pg, kc).with("WALRELAY_FAULT_KILL_AFTER_ACKS", after), "run")
		code := p.exit(60 * time.Second)
		if code != -1 { // killed by a signal
			t.Fatalf("run %d: exit %d, want killed by SIGKILL:\n%s", i+1, code, tail(p.out.String(), 2000))
		}
		t.Logf("killed after ack %s; slot at %s", after, slotConfirmed(t, conn, "walrelay"))
	}
	streaming(t, baseEnv(pg, kc))
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("after three kills between ack and confirm: %s", c)
	if c.duplicates == 0 {
		t.Fatalf("no duplicates: the kills did not land between an ack and its confirmation")
	}
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
}

// TestLongKafkaPartition holds the broker behind a network partition for
// 65 s, longer than the server's wal_sender_timeout (60 s), while rows are
// written: the status updates that walrelay sends while it waits on Kafka
// keep the replication session alive (same walsender before and after),
// nothing is confirmed past what Kafka has, and everything arrives after.
func TestLongKafkaPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("65 s of partition")
	}
	t.Parallel()
	_, col, fk, conn, w := warmStream(t, 14, 1000)
	ctx := t.Context()
	walsender := func() int {
		var pid int
		if err := conn.QueryRow(ctx, "SELECT coalesce(max(active_pid), 0) FROM pg_replication_slots WHERE slot_name = 'walrelay'").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		return pid
	}
	before := walsender()
	fk.Partition()
	if err := w.write(ctx, conn, 3000, 20); err != nil {
		t.Fatal(err)
	}
	waitSent(t, conn)
	held := slotConfirmed(t, conn, "walrelay")
	time.Sleep(62 * time.Second)
	if got := slotConfirmed(t, conn, "walrelay"); got != held {
		t.Fatalf("confirmed_flush_lsn moved from %s to %s during the partition", held, got)
	}
	during := walsender()
	fk.Up()
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("after a 65 s partition of the broker: %s; walsender %d before, %d at its end", c, before, during)
	if during != before {
		t.Fatalf("the replication session did not survive the wait on Kafka: walsender %d, then %d", before, during)
	}
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
}

// TestSlowBroker delays every answer of the broker by 200 ms for 30 s while
// rows are written: events keep arriving and the slot keeps moving during
// the slowness (a slow broker is not an outage), and afterwards every id is
// there in order.
func TestSlowBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("30 s of slowness")
	}
	t.Parallel()
	_, col, fk, conn, w := warmStream(t, 15, 500)
	ctx := t.Context()
	fk.Slow(200 * time.Millisecond)
	slowFrom, recsFrom, lsnFrom := time.Now(), len(col.Records()), slotConfirmed(t, conn, "walrelay")
	for time.Since(slowFrom) < 30*time.Second {
		if err := w.write(ctx, conn, 10, 10); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	recsDuring, lsnDuring := len(col.Records())-recsFrom, slotConfirmed(t, conn, "walrelay")
	fk.Up()
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("30 s of a broker answering 200 ms late: %d records arrived during it, slot %s -> %s; after: %s", recsDuring, lsnFrom, lsnDuring, c)
	if recsDuring == 0 || lsnDuring == lsnFrom {
		t.Fatalf("nothing moved while the broker was slow: %d records, slot %s -> %s", recsDuring, lsnFrom, lsnDuring)
	}
	if c.orderViolations != 0 || c.duplicates != 0 {
		t.Fatalf("a slow broker is no failure, want no duplicates and no order violations: %s", c)
	}
}

// TestBrokerMessageSizeLimit: the topic's max.message.bytes on the broker
// is 30,000 bytes, far below kafka.batch_max_bytes (1,000,012). A row larger
// than the topic allows is dead-lettered with its id and the error; the 200
// rows of ~2 KB written in one transaction with it, which would overflow the
// topic's limit only together in one batch, all arrive on their topic; and
// the row after them arrives too.
func TestBrokerMessageSizeLimit(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	createTopic(t, kc.Addrs(), kc.topic("order"), map[string]string{"max.message.bytes": "30000"})
	conn := connect(t, pg.DSN)
	p := streaming(t, baseEnv(pg, kc))
	sizeLimitCase(t, conn, kc, col, p)
}

// TestTopicLimitLoweredWhileRunning lowers the topic's max.message.bytes
// after walrelay learnt it: the broker refuses whole batches, small records
// and all. The refusal restarts the stream and walrelay reads the limit
// again; only the record over the new limit is dead-lettered.
func TestTopicLimitLoweredWhileRunning(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	createTopic(t, kc.Addrs(), kc.topic("order"), nil)
	conn := connect(t, pg.DSN)
	p := streaming(t, baseEnv(pg, kc))
	w := newWriter(5, 7)
	if err := w.write(t.Context(), conn, 10, 5); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	alterTopic(t, kc.Addrs(), kc.topic("order"), "max.message.bytes", "30000")
	sizeLimitCase(t, conn, kc, col, p)
}

// sizeLimitCase writes 200 rows of about 2 KB, one of about 45 KB over the
// topic's 30,000-byte limit, and one more, and checks that only the large
// one is dead-lettered.
func sizeLimitCase(t *testing.T, conn *pgx.Conn, kc *broker, col *kafkatest.Collector, p *proc) {
	t.Helper()
	ctx := t.Context()
	// md5 hex is close to incompressible for lz4, so batches stay large on
	// the wire.
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), 'order', 'agg-' || (i % 20), 'Small', jsonb_build_object('pad', (SELECT string_agg(md5(i::text || '-' || j), '') FROM generate_series(1, 64) AS j))
		FROM generate_series(1, 200) AS i`); err != nil {
		t.Fatal(err)
	}
	big, next := newUUID(), newUUID()
	insert := `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		VALUES ($1, 'order', 'big', 'Big', jsonb_build_object('pad', (SELECT string_agg(md5(j::text), '') FROM generate_series(1, $2::int) AS j)))`
	if _, err := conn.Exec(ctx, insert, big, 1400); err != nil { // ~45 KB
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, insert, next, 1); err != nil {
		t.Fatal(err)
	}
	want := committedIDs(t, conn)
	// Distinct ids: a refused batch restarts the stream, which resends.
	place := func(recs []*kgo.Record) (onTopic, onDLQ map[string]bool) {
		onTopic, onDLQ = map[string]bool{}, map[string]bool{}
		for _, r := range recs {
			id := string(kafkatest.Header(r, "id"))
			switch r.Topic {
			case kc.dlq():
				onDLQ[id] = true
				if got := string(kafkatest.Header(r, "walrelay.error")); id == big && !strings.Contains(got, "MESSAGE_TOO_LARGE") {
					t.Fatalf("dead-letter error %q, want MESSAGE_TOO_LARGE", got)
				}
			case kc.topic("order"):
				onTopic[id] = true
			default:
				t.Fatalf("record %s (type %s) on %s", id, kafkatest.Header(r, "type"), r.Topic)
			}
		}
		return onTopic, onDLQ
	}
	recs, err := col.Wait(ctx, func(recs []*kgo.Record) bool {
		onTopic, onDLQ := place(recs)
		return len(onTopic)+len(onDLQ) >= len(want) && onDLQ[big]
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(p.out.String(), 2000))
	}
	onTopic, onDLQ := place(recs)
	t.Logf("topic max.message.bytes 30000: %d records, %d distinct on the topic, %d dead-lettered", len(recs), len(onTopic), len(onDLQ))
	if len(onTopic) != len(want)-1 || len(onDLQ) != 1 || onTopic[big] {
		t.Fatalf("%d on the topic and %d dead-lettered, want %d and only the large one", len(onTopic), len(onDLQ), len(want)-1)
	}
}
