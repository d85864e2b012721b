package recovery

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/migrations"
)

// pruneFixture is an outbox with a timestamp column, n rows two hours old,
// and the logical slots named (created before the rows).
func pruneFixture(t *testing.T, n int, slots ...string) (*pgtest.Server, *pgx.Conn, *Table) {
	t.Helper()
	ctx := t.Context()
	pg, conn := serverConn(t)
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
	return pg, conn, tb
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
	_, conn, tb := pruneFixture(t, 20, a, b)
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

// TestPruneStartCoversAsyncCommits: with synchronous_commit off, a
// transaction is visible as soon as its commit record is in the WAL
// buffers, before it is written. The position prune waits for the slot to
// pass must cover it: the insert position, not the write position
// (pg_current_wal_lsn), which can lag it by up to three wal_writer_delay
// (here 10 s, so that the WAL writer does not close the window). Before,
// the start was behind the commit of a row the snapshot saw: the slot could
// confirm it without having published that row, and prune delete it.
func TestPruneStartCoversAsyncCommits(t *testing.T) {
	t.Parallel()
	const slot = "prune_async"
	pg, conn, tb := pruneFixture(t, 1, slot)
	if pg.External() {
		t.Skip("it sets wal_writer_delay: it needs a throwaway server")
	}
	ctx := t.Context()
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET wal_writer_delay = '10s'"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the WAL writer reads it when it next wakes (200 ms)
	w, err := pgx.Connect(ctx, conn.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	var end string
	for try := 0; ; try++ {
		// A synchronous commit first writes what is buffered; the async
		// one after it is left in the buffers, unless it ends on another
		// page (the WAL writer is then woken): tried again.
		if _, err := w.Exec(ctx, "SET synchronous_commit = on; CREATE TEMPORARY TABLE IF NOT EXISTS flush (x int); INSERT INTO flush VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Exec(ctx, "SET synchronous_commit = off"); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, ts)
			VALUES (gen_random_uuid(), 'order', 'async', 'T', '{}', now() - interval '2 hours')`); err != nil {
			t.Fatal(err)
		}
		var unwritten bool
		if err := w.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text, pg_current_wal_lsn() < pg_current_wal_insert_lsn()").Scan(&end, &unwritten); err != nil {
			t.Fatal(err)
		}
		if unwritten {
			break
		}
		if try == 5 {
			t.Skip("the WAL writer wrote each async commit at once: no window to test")
		}
	}
	var committed pglogrepl.LSN
	if err := (lsnScanner{&committed}).Scan(end); err != nil {
		t.Fatal(err)
	}
	p := &Pruner{Table: tb, Slot: slot, Wait: time.Second, Dry: true}
	res, _ := p.Run(ctx, time.Hour)
	if res.Start < committed {
		t.Fatalf("prune's start %s is behind the end %s of the commit of a row its snapshot sees, written with synchronous_commit off", res.Start, committed)
	}
}

// TestPageStart: the insert position at the end of a page's header is
// taken back to the page's start; any other position is kept.
func TestPageStart(t *testing.T) {
	t.Parallel()
	const block, segment = 8192, 16 << 20
	for _, c := range []struct{ in, want pglogrepl.LSN }{
		{3*block + 24, 3 * block},
		{3*block + 32, 3*block + 32}, // the tail of a continued record ends here
		{segment + 40, segment},
		{segment + 24, segment + 24}, // inside a segment's long header: kept
		{3*block + 100, 3*block + 100},
	} {
		if got := pageStart(c.in, block, segment); got != c.want {
			t.Errorf("pageStart(%s) = %s, want %s", c.in, got, c.want)
		}
	}
}

// TestPruneDryCountsBigintIDsOnce: a dry run over bigint ids that cross a
// digit boundary (1 to 2,500, 1,000 a batch) counts each row once. Before,
// the cursor was the largest id as text ("999" of 1..1000), so the next
// batch began at 1,000 again: 2,501 counted.
func TestPruneDryCountsBigintIDsOnce(t *testing.T) {
	t.Parallel()
	const slot = "prune_bigint"
	_, conn, _ := pruneFixture(t, 0, slot)
	ctx := t.Context()
	if _, err := conn.Exec(ctx, `CREATE TABLE bigbox (id bigint PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb, ts timestamptz);
		INSERT INTO bigbox SELECT i, 'order', 'a' || i, 'T', '{}', now() - interval '2 hours' FROM generate_series(1, 2500) i`); err != nil {
		t.Fatal(err)
	}
	tb, err := Open(ctx, conn, decoder.Layout{Table: "bigbox", TimestampColumn: "ts"})
	if err != nil {
		t.Fatal(err)
	}
	advance(t, conn.Config().ConnString(), slot)
	res, err := (&Pruner{Table: tb, Slot: slot, Wait: 10 * time.Second, Dry: true}).Run(ctx, time.Hour)
	if err != nil || res.Deleted != 2500 {
		t.Fatalf("dry run: %d rows counted, %v; want 2500", res.Deleted, err)
	}
}
