package migrations

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
)

// conns gives a test a server and n connections to it, closed when the
// test ends.
func conns(t *testing.T, n int) []*pgx.Conn {
	t.Helper()
	pg := pgtest.Start(t)
	cs := make([]*pgx.Conn, n)
	for i := range cs {
		cs[i] = pgtest.Connect(t, pg.DSN)
	}
	return cs
}

// polled gives conn's database the outbox of migrate --poll (Apply, then
// ApplyPoll, with the default layout).
func polled(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	if _, err := Apply(t.Context(), conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyPoll(t.Context(), conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
}

// TestCreatedAtWaitsBounded: adding created_at to a table that a long
// transaction uses waits a bounded time for the table's lock, then fails
// naming the cause, having changed nothing (the application's writes
// would queue behind an unbounded wait); once the transaction ends, it is
// added.
func TestCreatedAtWaitsBounded(t *testing.T) {
	ctx := t.Context()
	cs := conns(t, 2)
	conn, other := cs[0], cs[1]
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)`); err != nil {
		t.Fatal(err)
	}
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT count(*) FROM outbox"); err != nil {
		t.Fatal(err)
	}
	was := createdAtLockWait
	createdAtLockWait = 300 * time.Millisecond
	t.Cleanup(func() { createdAtLockWait = was })
	if _, err := Apply(ctx, conn, decoder.Config{}); err == nil || !strings.Contains(err.Error(), "the table's lock was not free within 300ms") {
		t.Fatalf("Apply with the table in use: %v, want the bounded wait named", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := Apply(ctx, conn, decoder.Config{}); err != nil || len(res.CreatedAt) != 1 {
		t.Fatalf("Apply after: %+v, %v", res, err)
	}
}

// TestCreatedAtIndex: created_at is indexed for the time windows when
// migrate adds it to a new or small table; on a table over
// indexRowsAtOnce rows the build would hold the writers, so migrate gives
// the CREATE INDEX CONCURRENTLY statement instead.
func TestCreatedAtIndex(t *testing.T) {
	ctx := t.Context()
	conn := conns(t, 1)[0]
	was := indexRowsAtOnce
	indexRowsAtOnce = 10
	t.Cleanup(func() { indexRowsAtOnce = was })
	for _, sql := range []string{
		`CREATE SCHEMA big`,
		`CREATE TABLE big.outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)`,
		`INSERT INTO big.outbox SELECT gen_random_uuid(), 'a', 'b', 'c' FROM generate_series(1, 11)`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	res, err := Apply(ctx, conn, decoder.Config{Layout: decoder.Layout{Schema: "public", Table: "outbox"}, More: []decoder.Layout{{Schema: "big", Table: "outbox"}}})
	if err != nil {
		t.Fatal(err)
	}
	var indexes string
	if err := conn.QueryRow(ctx, `SELECT string_agg(indexrelid::regclass::text, ' ' ORDER BY 1) FROM pg_index WHERE indrelid IN ('public.outbox'::regclass, 'big.outbox'::regclass) AND NOT indisprimary`).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if indexes != "outbox_created_at" || res.CreatedAtIndex["big.outbox"] != `CREATE INDEX CONCURRENTLY IF NOT EXISTS "outbox_created_at" ON "big"."outbox" ("created_at")` || len(res.CreatedAtIndex) != 1 {
		t.Fatalf("indexes %q, statements %v; want the new table's index built and the large table's statement given", indexes, res.CreatedAtIndex)
	}
}

// TestCreatedAtOfExistingRowsIsUnknown: the rows a table holds when
// migrate adds created_at take CreatedAtUnknown (their time is not
// known), without a rewrite of the table (its file stays the same: a
// constant default is stored once in the catalog), and rows inserted
// after get the time of their insert. Before, they took the migration's
// time, which a time window took for theirs.
func TestCreatedAtOfExistingRowsIsUnknown(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	conn := conns(t, 1)[0]
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb);
		INSERT INTO outbox SELECT gen_random_uuid(), 'order', 'old-' || g, 'T', '{}' FROM generate_series(1, 10) g`); err != nil {
		t.Fatal(err)
	}
	var before, after uint32
	if err := conn.QueryRow(ctx, "SELECT pg_relation_filenode('outbox')").Scan(&before); err != nil {
		t.Fatal(err)
	}
	if res, err := Apply(ctx, conn, decoder.Config{}); err != nil || len(res.CreatedAt) != 1 {
		t.Fatalf("Apply: %+v, %v", res, err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', 'new', 'T', '{}')"); err != nil {
		t.Fatal(err)
	}
	var unknown, recent int
	if err := conn.QueryRow(ctx, `SELECT pg_relation_filenode('outbox'),
		count(*) FILTER (WHERE aggregateid LIKE 'old-%' AND created_at = $1::timestamptz),
		count(*) FILTER (WHERE aggregateid = 'new' AND created_at > now() - interval '1 minute')
		FROM outbox`, CreatedAtUnknown).Scan(&after, &unknown, &recent); err != nil {
		t.Fatal(err)
	}
	if before != after || unknown != 10 || recent != 1 {
		t.Fatalf("file %d then %d (want the same: no rewrite), %d old rows at %s (want 10), %d new row at its insert's time (want 1)", before, after, unknown, CreatedAtUnknown, recent)
	}
}
