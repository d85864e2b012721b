package recovery

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/migrations"
)

// pruneFixture is an outbox with a timestamp column, n rows two hours old,
// and the logical slots named (created before the rows).
func pruneFixture(t *testing.T, n int, slots ...string) (*pgx.Conn, *Table) {
	t.Helper()
	ctx := t.Context()
	pg := pgtest.Start(t)
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := migrations.Apply(ctx, conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", s) })
	}
	if _, err := conn.Exec(ctx, "ALTER TABLE outbox ADD COLUMN ts timestamptz"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, ts)
		SELECT gen_random_uuid(), 'order', 'a' || i, 'T', '{}', now() - interval '2 hours' FROM generate_series(1, $1::int) i`, n); err != nil {
		t.Fatal(err)
	}
	tb, err := Open(ctx, conn, decoder.Layout{TimestampColumn: "ts"})
	if err != nil {
		t.Fatal(err)
	}
	return conn, tb
}

// advance keeps moving the slots named to the current WAL position (as a
// walrelay streaming them would) until the test ends.
func advance(t *testing.T, dsn string, slots ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		defer conn.Close(context.Background())
		for ctx.Err() == nil {
			for _, s := range slots {
				_, _ = conn.Exec(ctx, "SELECT pg_replication_slot_advance($1, pg_current_wal_insert_lsn())", s)
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
}

// TestPruneWaitsForEverySlot: an outbox sharded over two slots (one
// walrelay each, a row filter each): prune, configured with the first
// shard's slot, must not delete rows the second shard has not confirmed.
// It refuses, naming the slot behind; once every slot is past its start it
// deletes; a slot that does not read the outbox can be left out by name.
// Before, prune waited for its own slot only and deleted the rows.
func TestPruneWaitsForEverySlot(t *testing.T) {
	t.Parallel()
	const a, b = "prune_shard_a", "prune_shard_b"
	conn, tb := pruneFixture(t, 20, a, b)
	advance(t, conn.Config().ConnString(), a)
	p := &Pruner{Table: tb, Slot: a, Wait: 2 * time.Second}
	res, err := p.Run(t.Context(), time.Hour)
	if err == nil || !strings.Contains(err.Error(), b) {
		t.Fatalf("with slot %s behind: deleted %d rows, error %v; want a refusal naming %s", b, res.Deleted, err, b)
	}
	var left int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM outbox").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 20 {
		t.Fatalf("%d rows left after the refusal, want 20", left)
	}
	p.Ignore = []string{b}
	if res, err := p.Run(t.Context(), time.Hour); err != nil || res.Deleted != 20 {
		t.Fatalf("with %s left out by name: deleted %d, %v", b, res.Deleted, err)
	}
}
