package poll

import (
	"testing"
)

func TestTmpExplain(t *testing.T) {
	conn, tb := claimFixture(t, Config{Ordering: OrderAggregate, OnDead: DeadBlock})
	for i := 0; i < 60; i++ {
		insertMany(t, conn, []string{"a", "b", "c", "d"}[i%4], 1)
	}
	tb.batch = 8
	conn.Exec(t.Context(), "UPDATE outbox SET status='DEAD' WHERE id = (SELECT id FROM outbox ORDER BY created_at LIMIT 1)")
	conn.Exec(t.Context(), "SET enable_seqscan = off; SET enable_sort = off")
	for _, q := range []string{tb.claimSQL, tb.releaseSQL} {
		args := []any{tb.batch, "c", tb.leaseSecs, tb.maxBytes, tb.maxEvent}
		if q == tb.releaseSQL {
			args = args[:1]
		}
		rows, err := conn.Query(t.Context(), "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+q, args...)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			rows.Scan(&s)
			t.Log(s)
		}
		rows.Close()
	}
}
