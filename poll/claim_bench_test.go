package poll

import (
	"os"
	"strconv"
	"testing"
)

// BenchmarkClaimBehindBlockedAggregate measures a claim of an outbox whose
// oldest due rows are the backlog of one blocked aggregate: its first row
// in backoff, WALRELAY_BENCH_BLOCKED_ROWS (200,000) rows behind it, then
// 100 rows of other aggregates, which the claim takes. Each claim is
// rolled back, so every iteration sees the same table. Run by hand:
//
//	go test -run '^$' -bench BenchmarkClaimBehindBlockedAggregate -benchtime 20x ./poll/
//
// (issue 36 item 6: the NOT EXISTS filter runs before the LIMIT, for each
// row of the blocked backlog; see docs/benchmarks.md.)
func BenchmarkClaimBehindBlockedAggregate(b *testing.B) {
	n := 200_000
	if v, err := strconv.Atoi(os.Getenv("WALRELAY_BENCH_BLOCKED_ROWS")); err == nil && v > 0 {
		n = v
	}
	conn, tb := claimFixture(b, Config{Ordering: OrderAggregate})
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
	if _, err := conn.Exec(ctx, "SET enable_seqscan = off; SET enable_sort = off"); err != nil { // as the poller's session
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
}
