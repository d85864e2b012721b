package recovery

import (
	"errors"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/outbox"
)

// windowIDs returns the aggregate ids of the rows of window w, sorted.
func windowIDs(t *testing.T, tb *Table, w Window) []string {
	t.Helper()
	var got []string
	if err := tb.Rows(t.Context(), nil, w, func(r Row) error {
		got = append(got, r.Event.AggregateID)
		return nil
	}); err != nil {
		t.Fatalf("window %+v: %v", w, err)
	}
	slices.Sort(got)
	return got
}

// insertMixed writes one row with a random (v4) id and one with a UUIDv7
// id per tag, with the extra columns and values of set (", created_at",
// ", now() - interval '2 hours'"), if any.
func insertMixed(t *testing.T, conn *pgx.Conn, tag, cols, vals string) {
	t.Helper()
	if _, err := conn.Exec(t.Context(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload`+cols+`)
		VALUES ($1::uuid, 'order', $2 || '-v7', 'T', '{}'`+vals+`), (gen_random_uuid(), 'order', $2 || '-v4', 'T', '{}'`+vals+`)`, outbox.NewID(), tag); err != nil {
		t.Fatal(err)
	}
}

// TestTimeWindowsOnMixedIDs: the table migrate creates, written with random
// ids (the README's SQL) and UUIDv7 ids (package outbox) alike: time
// windows select by the created_at column migrate gives it, whatever the
// ids, and prune deletes the old rows of both kinds and no new one. Before,
// a window on such a table was refused (the ids of public.outbox are not
// UUIDv7) or, when the row it looked at was a UUIDv7, placed the random
// ids by their random bits.
func TestTimeWindowsOnMixedIDs(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pg, conn := serverConn(t)
	const slot = "window_mixed"
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot) })
	res, err := migrations.Apply(ctx, conn, decoder.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(res.CreatedAt, "public.outbox") {
		t.Fatalf("migrate gave no table created_at: %+v", res)
	}
	insertMixed(t, conn, "new", "", "") // the UUIDv7 first: the row a sample of one would look at
	insertMixed(t, conn, "old", ", created_at", ", now() - interval '2 hours'")
	tb, err := Open(ctx, conn, decoder.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	if timed, err := tb.Timed(ctx); err != nil || !timed || tb.TimeColumn() != "created_at" {
		t.Fatalf("Timed %v, %v, time column %q: want created_at", timed, err, tb.TimeColumn())
	}
	now := time.Now()
	if got := strings.Join(windowIDs(t, tb, Window{Since: now.Add(-time.Hour)}), " "); got != "new-v4 new-v7" {
		t.Fatalf("--since 1h: %s, want new-v4 new-v7", got)
	}
	if got := strings.Join(windowIDs(t, tb, Window{Until: now.Add(-time.Hour)}), " "); got != "old-v4 old-v7" {
		t.Fatalf("--until 1h ago: %s, want old-v4 old-v7", got)
	}
	advance(t, pg.DSN, slot)
	p := &Pruner{Table: tb, Slot: slot, Wait: 10 * time.Second}
	if res, err := p.Run(ctx, time.Hour); err != nil || res.Deleted != 2 {
		t.Fatalf("prune --older-than 1h: deleted %d, %v; want the 2 old rows", res.Deleted, err)
	}
	if got := strings.Join(windowIDs(t, tb, Window{All: true}), " "); got != "new-v4 new-v7" {
		t.Fatalf("after prune: %s, want new-v4 new-v7", got)
	}
}

// TestTimeWindowsOnExistingTable: a table of the layout before created_at,
// of mixed ids (a UUIDv7 row first, then a random one): a time window is
// refused, naming migrate (not placing the random id by its bits); migrate
// adds created_at without touching the rows, which take a time before any
// window (migrations.CreatedAtUnknown): a UUIDv7 row among them is placed
// by its id's time, a random one is in no window that has a start (it is
// older than any), and rows written after it have their own time. Before,
// the rows there took the migration's time: a window starting before the
// migration held the whole old table, days of rows a reconcile then
// counted missing (its topics read from the window's start) and a replay
// sent again, and the UUIDv7 rows lost the time of their ids.
func TestTimeWindowsOnExistingTable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, conn := serverConn(t)
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)`); err != nil {
		t.Fatal(err)
	}
	insertMixed(t, conn, "before", "", "")
	// A UUIDv7 row of two days ago, written before created_at existed.
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1::uuid, 'order', 'old-v7', 'T', '{}')`,
		uuidAt(time.Now().Add(-48*time.Hour))); err != nil {
		t.Fatal(err)
	}
	tb, err := Open(ctx, conn, decoder.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	err = tb.Rows(ctx, nil, Window{Since: time.Now().Add(-time.Hour)}, func(Row) error { return nil })
	if !errors.Is(err, ErrNoTime) || !strings.Contains(err.Error(), "walrelay migrate") {
		t.Fatalf("a window on mixed ids without created_at: %v; want ErrNoTime naming walrelay migrate", err)
	}
	migrated := time.Now()
	res, err := migrations.Apply(ctx, conn, decoder.Config{})
	if err != nil || !slices.Contains(res.CreatedAt, "public.outbox") || len(res.Created) != 0 {
		t.Fatalf("migrate of the existing table: %+v, %v; want created_at added", res, err)
	}
	time.Sleep(20 * time.Millisecond)
	insertMixed(t, conn, "after", "", "")
	if tb, err = Open(ctx, conn, decoder.Layout{}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(windowIDs(t, tb, Window{Since: migrated.Add(-time.Minute)}), " "); got != "after-v4 after-v7 before-v7" {
		t.Fatalf("--since a minute before the migration: %s, want the rows written after it and the UUIDv7 row of that minute (not the random id of unknown time, nor the UUIDv7 of two days ago)", got)
	}
	if got := strings.Join(windowIDs(t, tb, Window{Since: migrated.Add(-72 * time.Hour), Until: migrated.Add(-24 * time.Hour)}), " "); got != "old-v7" {
		t.Fatalf("--since 3 days --until 1 day before the migration: %s, want the UUIDv7 row of two days ago", got)
	}
	if got := strings.Join(windowIDs(t, tb, Window{Until: migrated.Add(-time.Minute)}), " "); got != "before-v4 old-v7" {
		t.Fatalf("--until a minute before the migration: %s, want the random id of unknown time (older than any window) and the UUIDv7 of two days ago", got)
	}
	var times []string
	if err := tb.Rows(ctx, nil, Window{All: true}, func(r Row) error {
		times = append(times, r.Event.AggregateID+"="+strconv.FormatBool(r.Time.IsZero()))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(times)
	if got := strings.Join(times, " "); got != "after-v4=false after-v7=false before-v4=true before-v7=false old-v7=false" {
		t.Fatalf("rows' times unknown (true): %s, want only the random id written before the migration", got)
	}
	if undated, err := tb.Undated(ctx); err != nil || !undated {
		t.Fatalf("Undated: %v, %v; want true (a random id written before the migration)", undated, err)
	}
	// Re-running migrate changes nothing.
	if res, err := migrations.Apply(ctx, conn, decoder.Config{}); err != nil || len(res.CreatedAt) != 0 {
		t.Fatalf("migrate again: %+v, %v", res, err)
	}
}

// TestDocsSQLRunsAsWritten: the SQL block of the README and of
// docs/outbox.md that writes an outbox row runs as written on a database
// walrelay migrate prepared (it creates the orders table it writes to),
// and its row, with its random id, is in a time window. Before, the block
// inserted into an orders table it never created.
func TestDocsSQLRunsAsWritten(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	conn := migratedConn(t)
	for _, doc := range []string{"../README.md", "../docs/outbox.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		var block string
		for _, m := range regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
			if strings.Contains(m[1], "INSERT INTO outbox") {
				block = m[1]
			}
		}
		if block == "" {
			t.Fatalf("%s: no SQL block writes an outbox row", doc)
		}
		if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS orders; DELETE FROM outbox"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, block); err != nil {
			t.Fatalf("%s: the SQL block fails: %v\n%s", doc, err, block)
		}
		tb, err := Open(ctx, conn, decoder.Layout{})
		if err != nil {
			t.Fatal(err)
		}
		if got := windowIDs(t, tb, Window{Since: time.Now().Add(-time.Minute)}); strings.Join(got, " ") != "order-42" {
			t.Fatalf("%s: the last minute's rows: %v, want order-42", doc, got)
		}
	}
}

// TestCreatedAtOfAnotherType: a created_at the table had before migrate,
// a timestamp without a zone (a Debezium user's, say), is left as it is
// and not read by the windows: on mixed ids a window is refused naming
// the column's type and outbox.timestamp_column, which then works.
func TestCreatedAtOfAnotherType(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, conn := serverConn(t)
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb, created_at timestamp DEFAULT (now() AT TIME ZONE 'UTC'))`); err != nil {
		t.Fatal(err)
	}
	if res, err := migrations.Apply(ctx, conn, decoder.Config{}); err != nil || len(res.CreatedAt) != 0 {
		t.Fatalf("migrate: %+v, %v; want the created_at there kept", res, err)
	}
	insertMixed(t, conn, "a", "", "")
	tb, err := Open(ctx, conn, decoder.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	err = tb.Rows(ctx, nil, Window{Since: time.Now().Add(-time.Hour)}, func(Row) error { return nil })
	if !errors.Is(err, ErrNoTime) || !strings.Contains(err.Error(), "its created_at is timestamp without time zone, not timestamptz; set outbox.timestamp_column: created_at") {
		t.Fatalf("a window: %v; want a refusal naming the column's type", err)
	}
	if tb, err = Open(ctx, conn, decoder.Layout{TimestampColumn: "created_at"}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(windowIDs(t, tb, Window{Since: time.Now().Add(-time.Hour)}), " "); got != "a-v4 a-v7" {
		t.Fatalf("with outbox.timestamp_column: %s, want a-v4 a-v7", got)
	}
}
