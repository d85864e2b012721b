package poll

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// BenchmarkClaimBehindBlockedAggregate measures a claim of an outbox whose
// oldest due rows are the backlog of one blocked aggregate: its first row
// in backoff, WALRELAY_BENCH_BLOCKED_ROWS (200,000) rows behind it, then
// 100 rows of other aggregates, which the claim takes. First, claims
// commit until one parks nothing more (each parks at most ten batches of
// the backlog: how many and how long they took are the parking-claims and
// parking-s metrics); 100 more rows of other aggregates are inserted, and
// each measured claim is rolled back, so every iteration sees the same
// table. The session has
// the poller's settings. Run by hand:
//
//	WALRELAY_BENCH_BLOCKED_ROWS=200000 go test -run '^$' -bench BenchmarkClaimBehindBlockedAggregate -benchtime 5x ./poll/
//
// (issue 36 item 6; see docs/benchmarks.md.)
func BenchmarkClaimBehindBlockedAggregate(b *testing.B) {
	n := 200_000
	if v, err := strconv.Atoi(os.Getenv("WALRELAY_BENCH_BLOCKED_ROWS")); err == nil && v > 0 {
		n = v
	}
	conn, tb := claimFixture(b, Config{Ordering: OrderAggregate, BatchSize: 1000}) // the default batch
	ctx := b.Context()
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), 'order', 'blocked', 'T', '{}' FROM generate_series(1, $1::int)`, n); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), 'order', 'other-' || i, 'T', '{}' FROM generate_series(1, 100) i`); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE outbox SET available_at = now() + interval '1 hour', attempts = 1
		WHERE id = (SELECT id FROM outbox WHERE aggregateid = 'blocked' ORDER BY created_at, id LIMIT 1)`); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "VACUUM ANALYZE outbox"); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, sessionSettings); err != nil { // as the poller's session
		b.Fatal(err)
	}
	// The claims that park the backlog (each at most ten batches), until
	// one parks nothing more; the first takes the 100 rows of the others.
	waiting := func() int {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE aggregateid = 'blocked' AND status = 'PENDING'").Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	start, claims := time.Now(), 0
	for left := -1; ; claims++ {
		rows, _, err := tb.claim(ctx, conn, "bench:0."+strconv.Itoa(claims))
		if err != nil || claims == 0 && len(rows) != 100 {
			b.Fatalf("claim %d: %d rows, %v", claims, len(rows), err)
		}
		now := waiting()
		if now == left || now <= 1 {
			claims++
			break
		}
		left = now
	}
	parking := time.Since(start)
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), 'order', 'more-' || i, 'T', '{}' FROM generate_series(1, 100) i`); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "VACUUM ANALYZE outbox"); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
			b.Fatal(err)
		}
		rows, _, err := tb.claim(ctx, conn, "bench:1")
		if err != nil {
			b.Fatal(err)
		}
		if len(rows) != 100 {
			b.Fatalf("claimed %d rows, want the 100 of the other aggregates", len(rows))
		}
		if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(claims), "parking-claims")
	b.ReportMetric(parking.Seconds(), "parking-s")
}
