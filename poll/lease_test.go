package poll

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
)

// probeReads runs fn in a transaction it rolls back, after a VACUUM of the
// outbox, and returns how many blocks of the outbox and its indexes fn
// read (pg_stat_get_xact_blocks_fetched; claimReads measures a claim with
// it).
func probeReads(t *testing.T, conn *pgx.Conn, fn func(tx pgx.Tx)) int64 {
	t.Helper()
	ctx := t.Context()
	if _, err := conn.Exec(ctx, "VACUUM outbox"); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // measured only
	const fetched = `SELECT sum(pg_stat_get_xact_blocks_fetched(oid))::int8 FROM pg_class
		WHERE oid = 'outbox'::regclass OR oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'outbox'::regclass)`
	var before, after int64
	if err := tx.QueryRow(ctx, fetched).Scan(&before); err != nil {
		t.Fatal(err)
	}
	fn(tx)
	if err := tx.QueryRow(ctx, fetched).Scan(&after); err != nil {
		t.Fatal(err)
	}
	return after - before
}

// TestClaimBehindLiveLeaseBounded (review of issue 36 item 6): the rows
// behind a row under a live lease (SENDING, claimed by another instance
// that waits for Kafka: an outage of minutes renews it) are parked as
// behind any blocked row, so the blocks a claim reads do not grow with
// that backlog; once the leased row is SENT they are released and
// claimed in order.
func TestClaimBehindLiveLeaseBounded(t *testing.T) {
	t.Parallel()
	conn, tb := claimFixture(t, Config{Ordering: OrderAggregate, OnDead: DeadSkip})
	ctx := t.Context()
	insertMany(t, conn, "leased", 21)
	if _, err := conn.Exec(ctx, `UPDATE outbox SET status = 'SENDING', claim_id = 'other:x:1', lease_until = now() + interval '1 hour', attempts = 1
		WHERE id = (SELECT id FROM outbox WHERE aggregateid = 'leased' ORDER BY created_at, id LIMIT 1)`); err != nil {
		t.Fatal(err)
	}
	others := func(round int) {
		for i := range 5 {
			insertMany(t, conn, fmt.Sprintf("other-%d-%d", round, i), 1)
		}
	}
	measure := func(round int) int64 {
		others(round)
		// The claims that park what can be parked, then the measured one.
		for i := range 4 {
			if _, _, err := tb.claim(ctx, conn, fmt.Sprintf("w:%d.%d", round, i)); err != nil {
				t.Fatal(err)
			}
		}
		others(round + 100)
		return probeReads(t, conn, func(tx pgx.Tx) {
			rows, _, err := tb.claim(ctx, tx.Conn(), "measure:1")
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != 5 {
				t.Fatalf("claimed %d rows, want the 5 of other aggregates", len(rows))
			}
		})
	}
	small := measure(0)
	insertMany(t, conn, "leased", 3000)
	large := measure(1)
	t.Logf("blocks read by a claim: %d with 20 rows behind a live lease, %d with 3,020", small, large)
	if large > 2*small+50 {
		t.Fatalf("a claim read %d blocks with 3,020 rows behind a row under a live lease, %d with 20: its work grows with the backlog behind a lease", large, small)
	}
	// The leased row is sent: the rows behind it come back, in order, a
	// batch at a time, and none is claimed ahead of an earlier one.
	if _, err := conn.Exec(ctx, `UPDATE outbox SET status = 'SENT', sent_at = now(), lease_until = NULL WHERE status = 'SENDING'`); err != nil {
		t.Fatal(err)
	}
	var want []string
	rows, err := conn.Query(ctx, `SELECT id::text FROM outbox WHERE aggregateid = 'leased' AND status <> 'SENT' ORDER BY created_at, id`)
	if err != nil {
		t.Fatal(err)
	}
	if want, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := 0; len(got) < len(want) && i < 200; i++ {
		release(t, conn, tb)
		rs, _, err := tb.claim(ctx, conn, fmt.Sprintf("after:%d", i))
		if err != nil {
			t.Fatal(err)
		}
		var m marks
		for _, r := range rs {
			if r.e.AggregateID == "leased" {
				got = append(got, r.id)
			}
			m.add(r.id, "SENT", 0, 0, "")
		}
		if _, err := tb.mark(ctx, conn, fmt.Sprintf("after:%d", i), &m); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("after the leased row was sent, %d of its aggregate's %d rows were claimed, in order: %v", len(got), len(want), slices.Equal(got, want[:min(len(got), len(want))]))
	}
}
