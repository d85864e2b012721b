package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/outbox"
)

// setupPoll gives a test a PostgreSQL whose outbox has the poll source's
// columns (walrelay migrate --poll: no publication, no slot), a broker and
// a collector of every outbox and dead-letter record.
func setupPoll(t *testing.T) (*pgtest.Server, *broker, *kafkatest.Collector) {
	t.Helper()
	kc := newBroker(t)
	pg := pgtest.Start(t)
	p := start(t, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate", "--poll")
	if code := p.exit(60 * time.Second); code != 0 {
		t.Fatalf("migrate --poll exited %d:\n%s", code, p.out.String())
	}
	return pg, kc, collector(t, kc)
}

// collector consumes the test's outbox topics and dead-letter topic.
func collector(t *testing.T, kc *broker) *kafkatest.Collector {
	t.Helper()
	q := regexp.QuoteMeta(kc.prefix)
	col, err := kafkatest.Collect(kc.Addrs(), q+`outbox\.event\..*|`+q+`walrelay\.dlq`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(col.Close)
	return col
}

// pollEnv is baseEnv with source poll.
func pollEnv(pg *pgtest.Server, kc *broker) env {
	return baseEnv(pg, kc).with("WALRELAY_SOURCE", "poll")
}

// polling starts walrelay with source poll and waits for its ready line.
func polling(t *testing.T, e env) *proc {
	t.Helper()
	p := start(t, e, "run")
	p.waitLog("msg=\"polling the outbox\"", 60*time.Second)
	return p
}

// statusCounts reads the outbox's rows by status.
func statusCounts(t *testing.T, conn *pgx.Conn) map[string]int {
	t.Helper()
	rows, err := conn.Query(t.Context(), "SELECT status, count(*) FROM outbox GROUP BY status")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[s] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitAllSent waits until every row of the outbox is SENT.
func waitAllSent(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	waitfor.Until(t, time.Minute, "every row SENT", func() bool {
		c := statusCounts(t, conn)
		return len(c) == 1 && c["SENT"] > 0
	})
}

// writeConcurrently writes total rows from writers writers at once, each
// with aggregates of its own (aggs in all), in transactions of 1 to maxTxn
// rows, and returns every id written.
func writeConcurrently(t *testing.T, dsn string, writers, aggs, total, maxTxn int) []string {
	t.Helper()
	var wg sync.WaitGroup
	ws := make([]*writer, writers)
	errs := make([]error, writers)
	for i := range ws {
		ws[i] = newWriter(aggs/writers, uint64(100+i))
		ws[i].prefix = fmt.Sprintf("w%d-agg-", i)
		wg.Go(func() {
			conn, err := pgx.Connect(t.Context(), dsn)
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close(t.Context())
			errs[i] = ws[i].write(t.Context(), conn, total/writers, maxTxn)
		})
	}
	wg.Wait()
	var ids []string
	for i, w := range ws {
		if errs[i] != nil {
			t.Fatalf("writer %d: %v", i, errs[i])
		}
		ids = append(ids, w.written()...)
	}
	return ids
}

// TestPollEveryEventInOrder: 10,000 events over 100 aggregates from four
// writers at once reach Kafka through the poll source, each once, in order
// per aggregate, with the key, headers and partition of the WAL source; and
// every row ends SENT with its sent_at. It needs no slot: none exists.
func TestPollEveryEventInOrder(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, col := setupPoll(t)
	conn := connect(t, pg.DSN)
	p := polling(t, pollEnv(pg, kc))
	began := time.Now()
	ids := writeConcurrently(t, pg.DSN, 4, 100, 10000, 10)
	c := waitAll(t, col, ids, 2*time.Minute)
	elapsed := time.Since(began)
	t.Logf("10,000 events from 4 writers delivered in %s (%.0f events/s): %s", elapsed.Round(time.Millisecond), 10000/elapsed.Seconds(), c)
	if c.duplicates != 0 || c.orderViolations != 0 || c.unexpected != 0 {
		t.Fatalf("want no duplicates, no order violations: %s", c)
	}
	created := map[string]time.Time{}
	rows, err := conn.Query(t.Context(), "SELECT id::text, created_at FROM outbox")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		created[id] = at
	}
	for _, r := range col.Records() {
		if want := javaPartition(r.Key, kafkatest.Partitions); r.Partition != want {
			t.Fatalf("key %q on partition %d; the Java client's murmur2 puts it on %d", r.Key, r.Partition, want)
		}
		if got := string(kafkatest.Header(r, "type")); got != "OrderUpdated" {
			t.Fatalf("type header %q", got)
		}
		// walrelay.commit_time is the row's created_at: the insert time.
		at, err := time.Parse(time.RFC3339Nano, string(kafkatest.Header(r, "walrelay.commit_time")))
		if id := string(kafkatest.Header(r, "id")); err != nil || !at.Equal(created[id]) {
			t.Fatalf("commit_time header of %s: %s (%v), its row's created_at %s", id, kafkatest.Header(r, "walrelay.commit_time"), err, created[id])
		}
	}
	waitAllSent(t, conn)
	var noSentAt, slots int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FILTER (WHERE sent_at IS NULL OR claim_id IS NULL OR attempts <> 1), (SELECT count(*) FROM pg_replication_slots) FROM outbox").Scan(&noSentAt, &slots); err != nil {
		t.Fatal(err)
	}
	if noSentAt != 0 || slots != 0 {
		t.Fatalf("%d rows without sent_at, claim_id or with attempts other than 1; %d replication slots", noSentAt, slots)
	}
	p.signal(syscall.SIGTERM)
	if code := p.exit(30 * time.Second); code != 0 {
		t.Fatalf("SIGTERM: exit %d", code)
	}
}

// metric reads the sum of a counter's series whose labels contain match
// from a walrelay's /metrics at addr.
func metric(t *testing.T, addr, name, match string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("read metrics: %v", err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || !strings.Contains(line, match) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// adminAddr reads the admin listener's address from a walrelay's log.
func adminAddr(t *testing.T, p *proc) string {
	t.Helper()
	p.waitLog("msg=\"admin listener\"", 30*time.Second)
	m := regexp.MustCompile(`msg="admin listener" addr=(\S+)`).FindStringSubmatch(p.out.String())
	if m == nil {
		t.Fatal("no admin listener address in the log")
	}
	return m[1]
}

// TestPollSIGKILL kills the poller three times while rows are written
// without pause: every row arrives, rows left SENDING are claimed again
// once their lease (1 s) ends, order per aggregate holds, and every row
// ends SENT.
func TestPollSIGKILL(t *testing.T) {
	t.Parallel()
	pg, kc, col := setupPoll(t)
	conn := connect(t, pg.DSN)
	e := pollEnv(pg, kc).with("WALRELAY_POLL_LEASE", "1s", "WALRELAY_POLL_BATCH_SIZE", "200")
	w := newWriter(50, 21)
	stop := w.writeInBackground(t.Context(), pg.DSN)
	expired := 0
	for i := range 3 {
		p := polling(t, e)
		time.Sleep(time.Duration(500+200*i) * time.Millisecond)
		p.kill()
		var sending int
		if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM outbox WHERE status = 'SENDING'").Scan(&sending); err != nil {
			t.Fatal(err)
		}
		expired += sending
	}
	polling(t, e)
	time.Sleep(500 * time.Millisecond)
	if n := stop(); n != 0 {
		t.Fatalf("%d writes failed", n)
	}
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("three SIGKILLs while writing: %s; %d rows were SENDING at the kills", c, expired)
	if c.orderViolations != 0 || c.unexpected != 0 {
		t.Fatalf("order violations: %s", c)
	}
	waitAllSent(t, conn)
}

// TestPollSeveralInstances runs two, then three pollers at once on the
// same outbox, with 2 s leases, while four writers write 4,000 rows: every event
// arrives in order per aggregate, and an event is published twice only
// where a lease expired (counted by the instances' walrelay_poll_rows_total
// lease_expired and lost_claim).
func TestPollSeveralInstances(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d_instances", n), func(t *testing.T) {
			t.Parallel()
			pg, kc, col := setupPoll(t)
			conn := connect(t, pg.DSN)
			var ps []*proc
			var addrs []string
			for i := range n {
				p := polling(t, pollEnv(pg, kc).with("WALRELAY_POLL_LEASE", "2s", "WALRELAY_POLL_BATCH_SIZE", "100",
					"WALRELAY_ADMIN_LISTEN", "127.0.0.1:0", "WALRELAY_POLL_WORKER_ID", fmt.Sprintf("w%d", i)))
				ps = append(ps, p)
				addrs = append(addrs, adminAddr(t, p))
			}
			ids := writeConcurrently(t, pg.DSN, 4, 100, 4000, 10)
			c := waitAll(t, col, ids, 2*time.Minute)
			waitAllSent(t, conn)
			var expired, lost float64
			claims := map[string]int{}
			for i, a := range addrs {
				expired += metric(t, a, "walrelay_poll_rows_total", `event="lease_expired"`)
				lost += metric(t, a, "walrelay_poll_rows_total", `event="lost_claim"`)
				claims[fmt.Sprintf("w%d", i)] = int(metric(t, a, "walrelay_poll_rows_total", `event="claimed"`))
			}
			t.Logf("%d instances: %s; rows claimed per instance %v; leases expired %v, claims lost %v", n, c, claims, expired, lost)
			if c.orderViolations != 0 || c.unexpected != 0 {
				t.Fatalf("order violations: %s", c)
			}
			if float64(c.duplicates) > expired {
				t.Fatalf("%d events published twice, but only %v leases expired", c.duplicates, expired)
			}
			for _, p := range ps {
				p.signal(syscall.SIGTERM)
				if code := p.exit(30 * time.Second); code != 0 {
					t.Fatalf("SIGTERM: exit %d", code)
				}
			}
		})
	}
}

// insertRow inserts one outbox row and returns its id.
func insertRow(t *testing.T, conn *pgx.Conn, aggType, aggID string, seq int) string {
	t.Helper()
	id := outbox.NewID()
	if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'OrderUpdated', $4)",
		id, aggType, aggID, fmt.Sprintf(`{"agg": %q, "seq": %d}`, aggID, seq)); err != nil {
		t.Fatal(err)
	}
	return id
}

// rowStatus reads a row's status.
func rowStatus(t *testing.T, conn *pgx.Conn, id string) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(t.Context(), "SELECT status FROM outbox WHERE id = $1", id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// recordOf returns the first record with event id id, if any.
func recordOf(col *kafkatest.Collector, id string) *kgo.Record {
	for _, r := range col.Records() {
		if string(kafkatest.Header(r, "id")) == id {
			return r
		}
	}
	return nil
}

// TestPollMaxAttempts: a row whose topic does not exist (topics are not
// created) fails every attempt, backs off, and after poll.max_attempts goes
// to the dead-letter topic (reason max_attempts) and DEAD; the later row of
// its aggregate (on a topic that exists) follows poll.on_dead: skip sends
// it after the row is DEAD, block holds it until walrelay poll retry (the
// topic created meanwhile) sends the dead row, then it. Another
// aggregate's row goes during the backoff.
func TestPollMaxAttempts(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"skip", "block"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			pg, kc, col := setupPoll(t)
			conn := connect(t, pg.DSN)
			createTopic(t, kc.Addrs(), kc.topic("order"), nil)
			createTopic(t, kc.Addrs(), kc.dlq(), nil)
			// An attempt on a missing topic takes the client some 13 s to
			// give up: skip shows one attempt, block two, with the backoff
			// between them.
			maxAttempts := map[string]int{"skip": 1, "block": 2}[policy]
			e := pollEnv(pg, kc).with("WALRELAY_KAFKA_AUTO_CREATE_TOPICS", "false", "WALRELAY_POLL_MAX_ATTEMPTS", fmt.Sprint(maxAttempts), "WALRELAY_POLL_ON_DEAD", policy)
			p := polling(t, e)
			ghost := insertRow(t, conn, "ghost", "A", 0)
			if maxAttempts > 1 {
				// Failed once, it backs off: later rows of its aggregate
				// may not be claimed.
				waitfor.Until(t, time.Minute, "the first attempt to fail", func() bool {
					var n int
					err := conn.QueryRow(t.Context(), "SELECT attempts FROM outbox WHERE id = $1 AND status = 'PENDING' AND last_error IS NOT NULL", ghost).Scan(&n)
					return err == nil && n == 1
				})
			}
			// Else it is claimed (later rows of its aggregate wait for
			// its lease), or claimed with the later row in one batch,
			// which holds the later row back: it goes to another topic.
			later := insertRow(t, conn, "order", "A", 1)
			other := insertRow(t, conn, "order", "B", 0)
			waitfor.Until(t, time.Minute, "the other aggregate's row on its topic", func() bool { return recordOf(col, other) != nil })
			if maxAttempts > 1 && rowStatus(t, conn, later) == "SENT" {
				// (With one attempt the row may be DEAD by now, and the
				// later one sent: the timestamps below tell the order.)
				t.Fatal("the later row of aggregate A was sent while its earlier row was failing")
			}
			waitfor.Until(t, 2*time.Minute, "the failing row DEAD", func() bool { return rowStatus(t, conn, ghost) == "DEAD" })
			waitfor.Until(t, time.Minute, "its dead letter", func() bool { return recordOf(col, ghost) != nil })
			var attempts int
			var lastErr string
			if err := conn.QueryRow(t.Context(), "SELECT attempts, last_error FROM outbox WHERE id = $1", ghost).Scan(&attempts, &lastErr); err != nil {
				t.Fatal(err)
			}
			dl := recordOf(col, ghost)
			if dl == nil || dl.Topic != kc.dlq() || string(kafkatest.Header(dl, "walrelay.reason")) != "max_attempts" {
				t.Fatalf("the dead row's dead letter: %v", dl)
			}
			t.Logf("dead after %d attempts: %s; dead letter error %q", attempts, lastErr, kafkatest.Header(dl, "walrelay.error"))
			if r := recordOf(col, other); maxAttempts > 1 && !r.Timestamp.Before(dl.Timestamp) {
				// Rounds do not overlap: an attempt delays the rows claimed
				// after it, but the backoff between attempts does not.
				t.Fatalf("the other aggregate's row was held until the dead letter (%s, %s)", r.Timestamp, dl.Timestamp)
			}
			if attempts != maxAttempts || !strings.Contains(lastErr, "max_attempts") {
				t.Fatalf("attempts %d, last_error %q", attempts, lastErr)
			}
			if policy == "skip" {
				waitfor.Until(t, time.Minute, "the later row sent", func() bool { return recordOf(col, later) != nil })
				if r := recordOf(col, later); r.Timestamp.Before(dl.Timestamp) {
					t.Fatalf("the later row was produced at %s, before the dead letter of the earlier one at %s", r.Timestamp, dl.Timestamp)
				}

				waitAllSentBut(t, conn, 1)
				return
			}
			// The claims passed the later row over behind the dead one:
			// it is parked (out of the claims' index) until that is sent.
			time.Sleep(3 * time.Second)
			if s := rowStatus(t, conn, later); s != "PARKED" || recordOf(col, later) != nil {
				t.Fatalf("on_dead block: the later row is %s (on the topic: %v)", s, recordOf(col, later) != nil)
			}
			code, out := runCmd(t, e, "poll", "dead", "--json")
			if code != 0 || !strings.Contains(out, ghost) || !strings.Contains(out, fmt.Sprintf(`"attempts": %d`, maxAttempts)) {
				t.Fatalf("poll dead --json:\n%s", out)
			}
			createTopic(t, kc.Addrs(), kc.topic("ghost"), nil)
			if code, out := runCmd(t, e, "poll", "retry", "--id", ghost); code != 0 || !strings.Contains(out, "would set 1 DEAD rows") {
				t.Fatalf("poll retry without --yes:\n%s", out)
			}
			if code, out := runCmd(t, e, "poll", "retry", "--id", ghost, "--id", later, "--yes"); code != 0 || !strings.Contains(out, "set 1 DEAD rows") || !strings.Contains(out, later) {
				t.Fatalf("poll retry --yes:\n%s", out)
			}
			// The dead row's record is on a topic created just now: the
			// collector finds it at its next metadata refresh, so wait
			// for the records rather than the rows' status.
			c := waitAll(t, col, []string{ghost, later, other}, time.Minute)
			if s := rowStatus(t, conn, ghost); s != "SENT" {
				t.Fatalf("the retried row is %s after its record arrived", s)
			}
			if c.orderViolations != 0 {
				t.Fatalf("after the retry: %s", c)
			}
			waitAllSent(t, conn)
			p.signal(syscall.SIGTERM)
			if code := p.exit(30 * time.Second); code != 0 {
				t.Fatalf("SIGTERM: exit %d", code)
			}
		})
	}
}

// waitAllSentBut waits until every row but dead ones (DEAD) is SENT.
func waitAllSentBut(t *testing.T, conn *pgx.Conn, dead int) {
	t.Helper()
	waitfor.Until(t, time.Minute, fmt.Sprintf("every row SENT but %d DEAD", dead), func() bool {
		c := statusCounts(t, conn)
		return len(c) == 2 && c["DEAD"] == dead
	})
}

// TestPollKafkaOutage takes the broker off the network for 10 s while rows
// are written: the claimed rows wait (their leases renewed) or back off, and
// every row is sent after, in order per aggregate.
func TestPollKafkaOutage(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, col := setupPoll(t)
	fk := kc.net(t)
	conn := connect(t, pg.DSN)
	p := polling(t, pollEnv(pg, kc).with("WALRELAY_POLL_LEASE", "3s", "WALRELAY_ADMIN_LISTEN", "127.0.0.1:0"))
	addr := adminAddr(t, p)
	w := newWriter(30, 31)
	if err := w.write(t.Context(), conn, 1000, 10); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	fk.Down()
	if err := w.write(t.Context(), conn, 2000, 10); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Second)
	if c := count(col.Records(), w.written()); c.missing == 0 {
		t.Fatalf("every row arrived while the broker was down: %s", c)
	}
	fk.Up()
	c := waitAll(t, col, w.written(), 2*time.Minute)
	waitAllSent(t, conn)
	t.Logf("after a 10 s outage: %s; rows retried %v, leases expired %v", c, metric(t, addr, "walrelay_poll_rows_total", `event="retried"`), metric(t, addr, "walrelay_poll_rows_total", `event="lease_expired"`))
	if c.orderViolations != 0 || c.unexpected != 0 {
		t.Fatalf("order violations: %s", c)
	}
}

// TestPollZombie: the instance that claimed a row stops (SIGSTOP) while
// Kafka answers 2 s late, past its 1 s lease; the other instance claims the
// row and marks it SENT. Resumed, the first one's mark matches no row (its
// claim_id is stale): the row stays SENT under the second claim, and the
// zombie counts a lost claim.
func TestPollZombie(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, col := setupPoll(t)
	fk := kc.net(t)
	conn := connect(t, pg.DSN)
	e := pollEnv(pg, kc).with("WALRELAY_POLL_LEASE", "1s", "WALRELAY_POLL_INTERVAL", "200ms")
	a := polling(t, e.with("WALRELAY_POLL_WORKER_ID", "A", "WALRELAY_ADMIN_LISTEN", "127.0.0.1:0"))
	addrA := adminAddr(t, a)
	b := polling(t, e.with("WALRELAY_POLL_WORKER_ID", "B", "WALRELAY_ADMIN_LISTEN", "127.0.0.1:0"))
	addrB := adminAddr(t, b)
	warm := insertRow(t, conn, "order", "warm", 0)
	waitfor.Until(t, time.Minute, "a first row sent", func() bool { return recordOf(col, warm) != nil })
	fk.Slow(2 * time.Second)
	id := insertRow(t, conn, "order", "Z", 0)
	var claim string
	waitfor.Until(t, 10*time.Second, "the row claimed", func() bool {
		err := conn.QueryRow(t.Context(), "SELECT coalesce(claim_id, '') FROM outbox WHERE id = $1 AND status = 'SENDING'", id).Scan(&claim)
		return err == nil && claim != ""
	})
	zombie, other, otherName, zombieAddr := a, b, "B", addrA
	if strings.HasPrefix(claim, "B:") {
		zombie, other, otherName, zombieAddr = b, a, "A", addrB
	}
	zombie.signal(syscall.SIGSTOP)
	waitfor.Until(t, 30*time.Second, "the other instance to send the row", func() bool {
		var st, c string
		err := conn.QueryRow(t.Context(), "SELECT status, claim_id FROM outbox WHERE id = $1", id).Scan(&st, &c)
		return err == nil && st == "SENT" && strings.HasPrefix(c, otherName+":")
	})
	zombie.signal(syscall.SIGCONT)
	fk.Up()
	waitfor.Until(t, 30*time.Second, "the zombie to count a lost claim", func() bool {
		return metric(t, zombieAddr, "walrelay_poll_rows_total", `event="lost_claim"`) == 1
	})
	var st, c string
	if err := conn.QueryRow(t.Context(), "SELECT status, claim_id FROM outbox WHERE id = $1", id).Scan(&st, &c); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range col.Records() {
		if string(kafkatest.Header(r, "id")) == id {
			n++
		}
	}
	t.Logf("zombie claim %s; row %s under claim %s; %d records of it on the topic", claim, st, c, n)
	if st != "SENT" || !strings.HasPrefix(c, otherName+":") || c == claim {
		t.Fatalf("the zombie's mark overwrote the newer claim: status %s claim %s", st, c)
	}
	_ = other
}

// receipts consumes topic from its start and notes when each event id
// first arrived.
type receipts struct {
	mu   sync.Mutex
	at   map[string]time.Time
	stop func()
}

func receive(t *testing.T, addrs []string, topic string) *receipts {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(10*time.Millisecond), kgo.MetadataMinAge(50*time.Millisecond), kgo.MetadataMaxAge(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r := &receipts{at: map[string]time.Time{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			now := time.Now()
			r.mu.Lock()
			fs.EachRecord(func(rec *kgo.Record) {
				id := string(kafkatest.Header(rec, "id"))
				if _, ok := r.at[id]; !ok {
					r.at[id] = now
				}
			})
			r.mu.Unlock()
		}
	}()
	r.stop = func() { cancel(); <-done; cl.Close() }
	t.Cleanup(r.stop)
	return r
}

func (r *receipts) of(id string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.at[id]
	return at, ok
}

// TestPollListenLatency measures commit-to-consume with LISTEN: with
// poll.interval 10 s, rows written one at a time 300 ms apart each arrive
// within 2 s (the notification wakes the poller; the interval alone would
// take up to 10 s); then one-row transactions at 1,000/s for 4 s, whose
// p50 and p99 it reports.
func TestPollListenLatency(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, _ := setupPoll(t)
	conn := connect(t, pg.DSN)
	createTopic(t, kc.Addrs(), kc.topic("order"), nil)
	rc := receive(t, kc.Addrs(), kc.topic("order"))
	polling(t, pollEnv(pg, kc).with("WALRELAY_POLL_INTERVAL", "10s"))
	time.Sleep(time.Second) // the first poll, at start, is done
	var sparse []time.Duration
	for i := range 12 {
		id := insertRow(t, conn, "order", fmt.Sprintf("sparse-%d", i), 0)
		committed := time.Now()
		waitfor.Until(t, 15*time.Second, "row "+id, func() bool { _, ok := rc.of(id); return ok })
		at, _ := rc.of(id)
		sparse = append(sparse, at.Sub(committed))
		time.Sleep(300 * time.Millisecond)
	}
	slices.Sort(sparse)
	t.Logf("one row at a time, poll.interval 10s: commit to consume median %s, max %s", sparse[len(sparse)/2], sparse[len(sparse)-1])
	if sparse[len(sparse)-1] > 2*time.Second {
		t.Fatalf("a row took %s to arrive with poll.interval 10s: LISTEN did not wake the poller", sparse[len(sparse)-1])
	}

	const rate, secs = 1000, 4
	ids := make([]string, 0, rate*secs)
	commits := make([]time.Time, 0, rate*secs)
	start := time.Now()
	for i := range rate * secs {
		if d := time.Until(start.Add(time.Duration(i) * time.Second / rate)); d > 0 {
			time.Sleep(d)
		}
		ids = append(ids, insertRow(t, conn, "order", fmt.Sprintf("agg-%d", i%100), i/100))
		commits = append(commits, time.Now())
	}
	achieved := float64(len(ids)) / time.Since(start).Seconds()
	waitfor.Until(t, time.Minute, "every row consumed", func() bool { _, ok := rc.of(ids[len(ids)-1]); return ok && len(rc.at) >= len(ids)+len(sparse) })
	lat := make([]time.Duration, len(ids))
	for i, id := range ids {
		at, ok := rc.of(id)
		if !ok {
			t.Fatalf("row %s not consumed", id)
		}
		lat[i] = at.Sub(commits[i])
	}
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	t.Logf("one-row transactions at %.0f/s for %d s: commit to consume p50 %s, p99 %s, max %s", achieved, secs, p50, p99, lat[len(lat)-1])
	if p99 > 5*time.Second {
		t.Fatalf("p99 %s at %.0f events/s", p99, achieved)
	}
}

// TestPollIdleLoad counts the transactions an idle poller (poll.interval
// 1s, the stats read every 5 s) runs on the database over 12 s, from
// pg_stat_database, and reports them per second.
func TestPollIdleLoad(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, _ := setupPoll(t)
	conn := connect(t, pg.DSN)
	polling(t, pollEnv(pg, kc))
	time.Sleep(2 * time.Second)
	commits := func() int64 {
		var n int64
		// This session's own statistics first, so that its reads count
		// (twice: subtracted below); the poller's connections report
		// theirs at least every 10 s when idle.
		if _, err := conn.Exec(t.Context(), "SELECT pg_stat_force_next_flush()"); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(t.Context(), "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const window = 12 * time.Second
	before := commits()
	time.Sleep(window)
	n := commits() - before - 2
	qps := float64(n) / window.Seconds()
	t.Logf("an idle poller: %d transactions in %s (%.2f/s) on the database", n, window, qps)
	if qps > 5 {
		t.Fatalf("an idle poller runs %.2f transactions/s", qps)
	}
}

// TestPollCommands: run and check refuse an outbox without the poll
// columns and name migrate --poll; migrate --poll adds them (again: nothing
// to add); check passes without asking for logical replication; a row with
// a NULL key goes to the dead-letter topic and DEAD at once; status shows
// the rows by state; poll retry --all sets it back; prune deletes only SENT
// rows.
func TestPollCommands(t *testing.T) {
	t.Parallel()
	kc := newBroker(t)
	pg := pgtest.Start(t)
	e := pollEnv(pg, kc)
	mustRun(t, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate")
	code, out := runCmd(t, e, "run")
	if code != 1 || !strings.Contains(out, "lacks what the poll source needs") || !strings.Contains(out, "walrelay migrate --poll") {
		t.Fatalf("run before migrate --poll: exit %d\n%s", code, out)
	}
	if code, out := runCmd(t, e, "check"); code != 1 || !strings.Contains(out, "walrelay migrate --poll") {
		t.Fatalf("check before migrate --poll: exit %d\n%s", code, out)
	}
	if code, out := runCmd(t, e, "migrate", "--poll"); code != 0 || !strings.Contains(out, "added status, attempts") {
		t.Fatalf("migrate --poll: exit %d\n%s", code, out)
	}
	if code, out := runCmd(t, e, "migrate"); code != 0 || !strings.Contains(out, "poll columns of public.outbox            present") {
		t.Fatalf("migrate again (source poll implies --poll): exit %d\n%s", code, out)
	}
	code, out = runCmd(t, e, "check")
	if code != 0 || strings.Contains(out, "wal_level") || strings.Contains(out, "replication role") || strings.Contains(out, "max_replication_slots") || !strings.Contains(out, "poll table") {
		t.Fatalf("check with source poll: exit %d\n%s", code, out)
	}
	conn := connect(t, pg.DSN)
	col := collector(t, kc)
	addr := freeAddr(t)
	ea := e.with("WALRELAY_ADMIN_LISTEN", addr)
	p := polling(t, ea)
	good := insertRow(t, conn, "order", "A", 0)
	bad := outbox.NewID()
	if _, err := conn.Exec(t.Context(), "ALTER TABLE outbox ALTER COLUMN aggregateid DROP NOT NULL"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', NULL, 'OrderUpdated', '{}')", bad); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, time.Minute, "the NULL-key row DEAD", func() bool { return rowStatus(t, conn, bad) == "DEAD" })
	waitfor.Until(t, time.Minute, "its dead letter", func() bool { return recordOf(col, bad) != nil })
	if dl := recordOf(col, bad); dl == nil || dl.Topic != kc.dlq() || string(kafkatest.Header(dl, "walrelay.reason")) != "invalid_event" {
		t.Fatalf("the NULL-key row's dead letter: %v", dl)
	}
	waitfor.Until(t, time.Minute, "the good row SENT", func() bool { return rowStatus(t, conn, good) == "SENT" })
	waitfor.Until(t, 30*time.Second, "status to count the DEAD row", func() bool {
		code, out := runCmd(t, ea, "status", "--json")
		return code == 0 && strings.Contains(out, `"source": "poll"`) && strings.Contains(out, `"dead_rows": 1`)
	})
	if code, out := runCmd(t, ea, "status"); code != 0 || !strings.Contains(out, "pending / sending / expired leases / dead") {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	if code, out := runCmd(t, ea, "status", "--ready"); code != 0 {
		t.Fatalf("status --ready while polling: exit %d\n%s", code, out)
	}
	if code, out := runCmd(t, e, "poll", "dead"); code != 0 || !strings.Contains(out, bad) || !strings.Contains(out, "invalid_event") {
		t.Fatalf("poll dead: exit %d\n%s", code, out)
	}
	if code, out := runCmd(t, e, "poll", "retry"); code != 2 {
		t.Fatalf("poll retry without --id or --all: exit %d\n%s", code, out)
	}
	if code, out := runCmd(t, e, "poll", "retry", "--all", "--yes"); code != 0 || !strings.Contains(out, "set 1 DEAD rows") {
		t.Fatalf("poll retry --all --yes: exit %d\n%s", code, out)
	}
	// Retried, it fails the same way: DEAD again after one attempt.
	waitfor.Until(t, time.Minute, "the NULL-key row DEAD again", func() bool {
		var st string
		var n int
		err := conn.QueryRow(t.Context(), "SELECT status, attempts FROM outbox WHERE id = $1", bad).Scan(&st, &n)
		return err == nil && st == "DEAD" && n == 1
	})
	p.signal(syscall.SIGTERM)
	if code := p.exit(30 * time.Second); code != 0 {
		t.Fatalf("SIGTERM: exit %d", code)
	}
	// Prune: rows sent long ago go, the DEAD row and a recent SENT row stay.
	old := insertRow(t, conn, "order", "C", 0)
	if _, err := conn.Exec(t.Context(), "UPDATE outbox SET status = 'SENT', sent_at = now() - interval '3 hours' WHERE id = $1 OR id = $2", old, good); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), "UPDATE outbox SET sent_at = now() - interval '3 hours' WHERE id = $1", bad); err != nil {
		t.Fatal(err)
	}
	recent := insertRow(t, conn, "order", "D", 0)
	if _, err := conn.Exec(t.Context(), "UPDATE outbox SET status = 'SENT', sent_at = now() WHERE id = $1", recent); err != nil {
		t.Fatal(err)
	}
	if code, out := runCmd(t, e, "prune", "--older-than", "2h", "--yes"); code != 0 || !strings.Contains(out, "deleted 2 SENT rows") {
		t.Fatalf("prune: exit %d\n%s", code, out)
	}
	left := texts(t, conn, "SELECT id::text FROM outbox ORDER BY id")
	slices.Sort(left)
	want := []string{bad, recent}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Fatalf("after prune: %v, want the DEAD row and the recent one %v", left, want)
	}
}

// TestPollDatabaseCrash crashes PostgreSQL (an immediate stop) while rows
// are written without pause, and starts it again 2 s later: the poller
// connects again by itself, the rows it had claimed are claimed again
// after their lease, and every committed row arrives, in order per
// aggregate, and ends SENT. Then a column of the outbox is renamed under
// the running poller: it stops with exit 1, naming the table and the
// column.
func TestPollDatabaseCrash(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, col := setupPoll(t)
	needThrowaway(t, pg, "crashes the server")
	p := polling(t, pollEnv(pg, kc).with("WALRELAY_POLL_LEASE", "2s"))
	w := newWriter(30, 41)
	w.dsn = pg.DSN
	stop := w.writeInBackground(t.Context(), pg.DSN)
	time.Sleep(time.Second)
	if err := pg.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := pg.StartServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	failed := stop()
	waitAll(t, col, w.written(), 2*time.Minute)
	// Every committed row, those whose commit's answer the crash cut too.
	conn := connect(t, pg.DSN)
	ids := committedIDs(t, conn)
	c := waitAll(t, col, ids, time.Minute)
	t.Logf("a PostgreSQL crash while writing: %s; %d writes failed, %d rows committed", c, failed, len(ids))
	if c.orderViolations != 0 || c.unexpected != 0 {
		t.Fatalf("order violations: %s", c)
	}
	waitAllSent(t, conn)
	if !strings.Contains(p.out.String(), "retrying") {
		t.Fatalf("the poller logged no retry:\n%s", tail(p.out.String(), 3000))
	}
	if _, err := conn.Exec(t.Context(), "ALTER TABLE outbox RENAME COLUMN aggregateid TO aggregate_id"); err != nil {
		t.Fatal(err)
	}
	if code := p.exit(30 * time.Second); code != 1 || !strings.Contains(p.out.String(), "the outbox table public.outbox changed under walrelay") ||
		!strings.Contains(p.out.String(), "aggregateid") {
		t.Fatalf("a renamed column: exit %d\n%s", code, tail(p.out.String(), 3000))
	}
}

// TestPollPartitionedOutbox: an outbox partitioned by created_at (the
// application's own column, kept by migrate --poll) is polled through its
// root: rows inserted through the root and straight into a partition (no
// notification: the interval finds them), and into a partition attached
// while walrelay runs, all arrive once, in created_at order per aggregate,
// and end SENT.
func TestPollPartitionedOutbox(t *testing.T) {
	t.Parallel()
	kc := newBroker(t)
	pg := pgtest.Start(t)
	conn := connect(t, pg.DSN)
	execSQL(t, conn,
		`CREATE TABLE outbox (id uuid, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL,
			payload jsonb, created_at timestamptz NOT NULL, PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`,
		`CREATE TABLE outbox_2026_01 PARTITION OF outbox FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')`,
		`CREATE TABLE outbox_2026_02 PARTITION OF outbox FOR VALUES FROM ('2026-02-01') TO ('2026-03-01')`)
	e := pollEnv(pg, kc)
	if code, out := runCmd(t, e, "migrate", "--poll"); code != 0 || !strings.Contains(out, "added status, attempts, available_at, claim_id, lease_until, last_error, sent_at") {
		t.Fatalf("migrate --poll on a partitioned outbox: exit %d\n%s", code, out)
	}
	col := collector(t, kc)
	polling(t, e)
	var ids []string
	insertAt := func(table, agg string, seq int, at string) {
		id := outbox.NewID()
		if _, err := conn.Exec(t.Context(), "INSERT INTO "+table+" (id, aggregatetype, aggregateid, type, payload, created_at) VALUES ($1, 'order', $2, 'T', $3, $4)",
			id, agg, fmt.Sprintf(`{"agg": %q, "seq": %d}`, agg, seq), at); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for i := range 20 {
		insertAt("outbox", "a", i, fmt.Sprintf("2026-01-%02d", i+1))
		insertAt("outbox", "b", i, fmt.Sprintf("2026-02-%02d", i+1))
	}
	insertAt("outbox_2026_02", "a", 20, "2026-02-25") // straight into the partition
	execSQL(t, conn, `CREATE TABLE outbox_2026_03 (LIKE outbox INCLUDING ALL)`,
		`ALTER TABLE outbox ATTACH PARTITION outbox_2026_03 FOR VALUES FROM ('2026-03-01') TO ('2026-04-01')`)
	insertAt("outbox", "a", 21, "2026-03-02")
	c := waitAll(t, col, ids, time.Minute)
	t.Logf("a partitioned outbox: %s", c)
	if c.duplicates != 0 || c.orderViolations != 0 || c.unexpected != 0 {
		t.Fatalf("want each row once, in order: %s", c)
	}
	waitAllSent(t, conn)
}

// TestPollWithoutLogicalReplication: on a server with wal_level=replica,
// and as a role with neither REPLICATION nor ownership of the outbox (only
// SELECT and UPDATE on it), check passes and the poll source relays every
// row; the WAL source on the same server is refused, naming wal_level.
func TestPollWithoutLogicalReplication(t *testing.T) {
	t.Parallel()
	kc := newBroker(t)
	pg := pgtest.Start(t)
	needThrowaway(t, pg, "changes wal_level")
	conn := connect(t, pg.DSN)
	execSQL(t, conn, "ALTER SYSTEM SET wal_level = replica")
	if err := pg.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	conn = connect(t, pg.DSN)
	var level string
	if err := conn.QueryRow(t.Context(), "SHOW wal_level").Scan(&level); err != nil || level != "replica" {
		t.Fatalf("wal_level %q (%v)", level, err)
	}
	// migrate for the WAL source checks the server first and changes
	// nothing.
	if code, out := runCmd(t, baseEnv(pg, kc), "migrate"); code != 1 || !strings.Contains(lastLine(out), "wal_level = replica: set wal_level = logical") ||
		!strings.Contains(lastLine(out), "migrate changed nothing") {
		t.Fatalf("migrate on wal_level=replica: exit %d\n%s", code, out)
	}
	var exists bool
	if err := conn.QueryRow(t.Context(), "SELECT to_regclass('public.outbox') IS NOT NULL OR EXISTS (SELECT 1 FROM pg_publication)").Scan(&exists); err != nil || exists {
		t.Fatalf("a refused migrate left a table or a publication (%v)", err)
	}
	mustRun(t, pollEnv(pg, kc), "migrate", "--poll")
	execSQL(t, conn, "CREATE ROLE poller LOGIN NOREPLICATION", "GRANT SELECT, UPDATE ON outbox TO poller")
	dsn := strings.Replace(pg.DSN, "postgres://postgres@", "postgres://poller@", 1)
	if dsn == pg.DSN {
		t.Fatalf("cannot make the poller's DSN from %s", pg.DSN)
	}
	e := pollEnv(pg, kc).with("WALRELAY_POSTGRES_DSN", dsn)
	if code, out := runCmd(t, e, "check"); code != 0 || !strings.Contains(out, "the role may select and update it") {
		t.Fatalf("check as a role without REPLICATION on wal_level=replica: exit %d\n%s", code, out)
	}
	col := collector(t, kc)
	polling(t, e)
	w := newWriter(20, 51)
	if err := w.write(t.Context(), conn, 2000, 10); err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, w.written(), time.Minute)
	if c.duplicates != 0 || c.orderViolations != 0 {
		t.Fatalf("want each row once, in order: %s", c)
	}
	waitAllSent(t, conn)
	if code, out := runCmd(t, baseEnv(pg, kc), "run"); code != 1 || !strings.Contains(out, "wal_level") {
		t.Fatalf("the WAL source on wal_level=replica: exit %d\n%s", code, tail(out, 2000))
	}
}

// TestPollLargePayloadsMemory: 120 rows of 500 KiB payloads (60 MiB)
// are relayed with a peak RSS under 64 MiB (without the race detector): a
// claim stops where its payloads pass half the producer's buffer (8 MiB),
// whatever poll.batch_size.
func TestPollLargePayloadsMemory(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, col := setupPoll(t)
	conn := connect(t, pg.DSN)
	w := newWriter(10, 61)
	w.bytes = 500 << 10
	if err := w.write(t.Context(), conn, 120, 1); err != nil {
		t.Fatal(err)
	}
	p := polling(t, pollEnv(pg, kc))
	c := waitAll(t, col, w.written(), 2*time.Minute)
	rss := p.peakRSS()
	t.Logf("120 rows of 500 KiB: %s; peak RSS %.1f MiB", c, float64(rss)/(1<<20))
	if c.duplicates != 0 || c.orderViolations != 0 {
		t.Fatalf("want each row once, in order: %s", c)
	}
	limit := int64(64 << 20)
	if raceEnabled {
		limit *= 4 // the race detector's shadow memory
	}
	if rss > limit {
		t.Fatalf("peak RSS %.1f MiB, want under %d MiB", float64(rss)/(1<<20), limit>>20)
	}
}

// TestPollDLQReplay: under poll.on_dead block, a row dead-lettered (a NULL
// key), then repaired, holds the later row of its aggregate; dlq replay
// sends it from the table and marks it SENT, so the later row goes, poll
// retry finds nothing to send again, and prune may delete it. Before, the
// row stayed DEAD after its replay: its aggregate stayed blocked.
func TestPollDLQReplay(t *testing.T) {
	t.Parallel()
	pg, kc, col := setupPoll(t)
	conn := connect(t, pg.DSN)
	e := pollEnv(pg, kc).with("WALRELAY_POLL_ON_DEAD", "block")
	p := polling(t, e)
	if _, err := conn.Exec(t.Context(), "ALTER TABLE outbox ALTER COLUMN aggregateid DROP NOT NULL"); err != nil {
		t.Fatal(err)
	}
	bad := outbox.NewID()
	if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', NULL, 'OrderCreated', '{}')", bad); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, time.Minute, "the NULL-key row DEAD", func() bool { return rowStatus(t, conn, bad) == "DEAD" })
	waitfor.Until(t, time.Minute, "its dead letter", func() bool { return recordOf(col, bad) != nil })
	if _, err := conn.Exec(t.Context(), "UPDATE outbox SET aggregateid = 'A' WHERE id = $1", bad); err != nil {
		t.Fatal(err)
	}
	later := insertRow(t, conn, "order", "A", 1)
	other := insertRow(t, conn, "order", "B", 0)
	waitfor.Until(t, time.Minute, "the other aggregate's row", func() bool { return recordOf(col, other) != nil })
	// The claim that took the other row passed the later one over behind
	// the dead row, and parked it; the replay releases it.
	if s := rowStatus(t, conn, later); s != "PARKED" {
		t.Fatalf("on_dead block: the later row is %s before the replay", s)
	}
	if code, out := runCmd(t, e, "dlq", "replay", "--id", bad, "--yes"); code != 0 || !strings.Contains(out, "1 reached their topic") {
		t.Fatalf("dlq replay: exit %d\n%s", code, out)
	}
	if s := rowStatus(t, conn, bad); s != "SENT" {
		t.Fatalf("after dlq replay the row is %s, want SENT", s)
	}
	c := waitAll(t, col, []string{bad, later, other}, time.Minute)
	if c.orderViolations != 0 {
		t.Fatalf("after the replay: %s", c)
	}
	if code, out := runCmd(t, e, "poll", "retry", "--id", bad, "--yes"); code != 0 || !strings.Contains(out, "set 0 DEAD rows") {
		t.Fatalf("poll retry of the replayed row: exit %d\n%s", code, out)
	}
	p.signal(syscall.SIGTERM)
	if code := p.exit(30 * time.Second); code != 0 {
		t.Fatalf("SIGTERM: exit %d", code)
	}
}
