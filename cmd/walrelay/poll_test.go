package main

import (
	"bufio"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/internal/kafkatest"
	"github.com/walrelay/walrelay/internal/pgtest"
	waitfor "github.com/walrelay/walrelay/internal/poll"
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
	q := regexp.QuoteMeta(kc.prefix)
	col, err := kafkatest.Collect(kc.Addrs(), q+`outbox\.event\..*|`+q+`walrelay\.dlq`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(col.Close)
	return pg, kc, col
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
	for _, r := range col.Records() {
		if want := javaPartition(r.Key, kafkatest.Partitions); r.Partition != want {
			t.Fatalf("key %q on partition %d; the Java client's murmur2 puts it on %d", r.Key, r.Partition, want)
		}
		if got := string(kafkatest.Header(r, "type")); got != "OrderUpdated" {
			t.Fatalf("type header %q", got)
		}
		if _, err := time.Parse(time.RFC3339Nano, string(kafkatest.Header(r, "walrelay.commit_time"))); err != nil {
			t.Fatalf("commit_time header: %v", err)
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
	e := pollEnv(pg, kc).with("WALRELAY_POLL_LEASE", "1s", "WALRELAY_POLL_BATCH_SIZE", "50")
	w := newWriter(50, 21)
	stop := w.writeInBackground(t.Context(), pg.DSN)
	expired := 0
	for i := range 3 {
		p := polling(t, e)
		time.Sleep(time.Duration(700+300*i) * time.Millisecond)
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
// same outbox, with 2 s leases, while four writers write: every event
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
			ids := writeConcurrently(t, pg.DSN, 4, 100, 8000, 10)
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
