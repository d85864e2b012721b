package main

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/outbox"
)

// TestKafkaOutage takes the broker off the network for 10 s mid-stream:
// walrelay does not confirm what Kafka did not acknowledge, resumes by
// itself, and nothing is lost. What the operator sees: walrelay status says
// Kafka is not answering and what is held, the log says so in walrelay's
// words when it happens and when Kafka answers again, and progress lines
// come at log.progress_interval.
func TestKafkaOutage(t *testing.T) {
	long(t)
	t.Parallel()
	addr := freeAddr(t)
	_, col, fk, conn, w, p, e := warmStreamWith(t, 5, 2000, "WALRELAY_ADMIN_LISTEN", addr, "WALRELAY_LOG_PROGRESS_INTERVAL", "1s")
	p.waitLog(`msg=progress`, 30*time.Second)
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
	p.waitLog(`msg="Kafka is not answering`, 30*time.Second)
	code, status := runCmd(t, e, "status")
	t.Logf("walrelay status during the outage:\n%s", status)
	if code != 0 || !strings.Contains(status, "NOT ANSWERING since") || !strings.Contains(status, "events held until it acknowledges them") {
		t.Fatalf("walrelay status during a Kafka outage (exit %d) does not say so:\n%s", code, status)
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
	p.waitLog(`msg="Kafka answers again"`, 30*time.Second)
	if code, status := runCmd(t, e, "status"); code != 0 || !strings.Contains(status, "answering") || strings.Contains(status, "NOT ANSWERING") {
		t.Fatalf("walrelay status after the outage (exit %d):\n%s", code, status)
	}
	var lines []string
	for _, l := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(l, "Kafka is not answering") || strings.Contains(l, "Kafka answers again") {
			lines = append(lines, l)
		}
	}
	t.Logf("walrelay's own lines about the outage:\n%s", strings.Join(lines, "\n"))
}

// TestBrokerDownWhileWriting takes the broker down, briefly and again and
// again, while rows are written without pause: the client fails records of a
// partition it cannot reach while walrelay is still producing to it, and
// none of what walrelay produced after the failure may reach the topic before
// the failed record is sent again.
func TestBrokerDownWhileWriting(t *testing.T) {
	long(t)
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
	pg, col, fk, conn, w, _, _ := warmStreamWith(t, seed, rows)
	return pg, col, fk, conn, w
}

// warmStreamWith is warmStream with more variables (name, value pairs) in
// walrelay's environment; it also returns the process and the environment.
func warmStreamWith(t *testing.T, seed uint64, rows int, vars ...string) (*pgtest.Server, *kafkatest.Collector, kafkatest.Network, *pgx.Conn, *writer, *proc, env) {
	t.Helper()
	pg, kc, col := setup(t)
	fk := kc.net(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc).with(vars...)
	p := streaming(t, e)
	w := newWriter(30, seed)
	if err := w.write(t.Context(), conn, rows, 20); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	return pg, col, fk, conn, w, p, e
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
	bad, good := outbox.NewID(), outbox.NewID()
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
	big, next := outbox.NewID(), outbox.NewID()
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
	bad := outbox.NewID()
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
	long(t) // eight refusals; TestBatchRefusalDeadLettersNothing refuses batches in the default suite
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
	long(t) // TestHeldRefusals refuses produce with each retriable code in the default suite
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

// TestLongKafkaPartition holds the broker behind a network partition for
// 65 s, longer than the server's wal_sender_timeout (60 s), while rows are
// written: the status updates that walrelay sends while it waits on Kafka
// keep the replication session alive (same walsender before and after),
// nothing is confirmed past what Kafka has, and everything arrives after.
func TestLongKafkaPartition(t *testing.T) {
	long(t) // 65 s of partition
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
	long(t) // 30 s of slowness
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
	big, next := outbox.NewID(), outbox.NewID()
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

// TestKafkaOutageLogLines: what the log says during a Kafka outage. The
// client's own line about a failed connection comes once per broker, its
// repeats folded (walrelay's lines count them: failed_connects); a progress
// line while events wait for Kafka does not call the relay idle.
func TestKafkaOutageLogLines(t *testing.T) {
	long(t) // waits out an outage; TestStartWaitsForKafka reads the outage lines in the default suite
	t.Parallel()
	_, col, fk, conn, w, p, _ := warmStreamWith(t, 37, 100, "WALRELAY_LOG_PROGRESS_INTERVAL", "1s")
	kc, ok := fk.(*kafkatest.Cluster)
	if !ok {
		t.Skip("needs kfake's listeners (Stop: connections refused); not run against the real broker")
	}
	kc.Stop() // Kafka stopped: connections refused
	if err := w.write(t.Context(), conn, 100, 10); err != nil {
		t.Fatal(err)
	}
	p.waitLog(`msg="Kafka is not answering`, 30*time.Second)
	mark := len(p.out.String())
	time.Sleep(2500 * time.Millisecond) // progress lines during the outage
	kc.Up()
	p.waitLog(`msg="Kafka answers again"`, 60*time.Second)
	waitAll(t, col, w.written(), time.Minute)

	var clientWarns, stalls int
	var again string
	for _, l := range strings.Split(p.out.String(), "\n") {
		switch {
		case strings.Contains(l, "level=WARN") && strings.Contains(l, "unable to open connection to broker"):
			clientWarns++
		case strings.Contains(l, "msg=progress") && !strings.Contains(l, "in_flight=0"):
			stalls++
			if strings.Contains(l, "idle=true") {
				t.Errorf("a progress line calls the relay idle with events in flight: %s", l)
			}
		case strings.Contains(l, `msg="Kafka answers again"`):
			again = l
		}
	}
	t.Logf("an outage of 3 s and more: %d WARN lines of the client about failed connections, %d progress lines with events in flight; %s", clientWarns, stalls, again)
	if clientWarns > len(kc.Addrs()) {
		t.Errorf("%d WARN lines of the client about failed connections in one outage: want at most one per broker, the rest folded into walrelay's lines", clientWarns)
	}
	if stalls == 0 {
		t.Errorf("no progress line with events in flight during the outage:\n%s", tail(p.out.String()[mark:], 3000))
	}
	if !strings.Contains(again, "failed_connects=") || strings.Contains(again, "failed_connects=0") {
		t.Errorf("walrelay's line when Kafka answers again does not count the failed connections: %s", again)
	}
}
