package outbox_test

import (
	"database/sql"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/outbox"
)

// setup starts a server and creates the outbox table of layout l, as
// walrelay migrate does.
func setup(t *testing.T, l decoder.Layout) *pgx.Conn {
	t.Helper()
	pg := pgtest.Start(t)
	conn := pgtest.Connect(t, pg.DSN)
	if l.Schema != "" {
		if _, err := conn.Exec(t.Context(), "CREATE SCHEMA "+pgx.Identifier{l.Schema}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := migrations.Apply(t.Context(), conn, decoder.Config{Layout: l}); err != nil {
		t.Fatal(err)
	}
	return conn
}

func count(t *testing.T, conn *pgx.Conn, table string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestWriteCommitsWithTheTransaction: events written in a transaction that
// commits are in the table, with UUIDv7 ids in creation order; in one that
// rolls back, they are not. With pgx and with database/sql.
func TestWriteCommitsWithTheTransaction(t *testing.T) {
	t.Parallel()
	conn := setup(t, decoder.Layout{})
	ctx := t.Context()
	order := outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "OrderCreated", Payload: []byte(`{"total": 12.50}`)}

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id, err := outbox.Write(ctx, tx, order)
	if err != nil {
		t.Fatal(err)
	}
	batch := make([]outbox.Event, 100)
	for i := range batch {
		batch[i] = order
	}
	ids, err := outbox.WriteBatch(ctx, tx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	all := append([]string{id}, ids...)
	if !slices.IsSorted(all) {
		t.Fatalf("ids of one process are not in creation order: %v", all[:5])
	}
	if at, ok := outbox.IDTime(id); !ok || time.Since(at) > time.Minute || time.Since(at) < 0 {
		t.Fatalf("id %s: time %s, %v; want a UUIDv7 of now", id, at, ok)
	}
	var payload, typ string
	if err := conn.QueryRow(ctx, "SELECT payload::text, type FROM outbox WHERE id = $1", id).Scan(&payload, &typ); err != nil {
		t.Fatal(err)
	}
	if payload != `{"total": 12.50}` || typ != "OrderCreated" {
		t.Fatalf("row %s: payload %s, type %s", id, payload, typ)
	}

	tx, err = conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.WriteBatch(ctx, tx, batch); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, conn, "outbox"); n != 101 {
		t.Fatalf("%d rows after a rolled-back batch, want 101", n)
	}

	db, err := sql.Open("pgx", conn.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, commit := range []bool{false, true} {
		stx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.WriteSQL(ctx, stx, order); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = stx.Commit()
		} else {
			err = stx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, conn, "outbox"); n != 102 {
		t.Fatalf("%d rows after database/sql writes (one rolled back, one committed), want 102", n)
	}

	// A caller's id is kept: a retry of the same operation reuses it.
	tx, err = conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	given := outbox.NewID()
	retry := order
	retry.ID = given
	if got, err := outbox.Write(ctx, tx, retry); err != nil || got != given {
		t.Fatalf("Write with ID %s: %s, %v", given, got, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestWriteRefusesBadInput: an event without aggregate type, id or type, a
// payload that is not JSON, and a header without a column are refused
// before anything reaches the database: the caller's transaction is still
// usable.
func TestWriteRefusesBadInput(t *testing.T) {
	t.Parallel()
	conn := setup(t, decoder.Layout{HeaderColumns: []string{"trace_id"}})
	ctx := t.Context()
	good := outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "OrderCreated", Payload: []byte(`{}`), Headers: map[string]string{"trace_id": "t-1"}}
	w, err := outbox.New(outbox.Config{Layout: decoder.Layout{HeaderColumns: []string{"trace_id"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		edit func(*outbox.Event)
		want string
	}{
		{"no aggregate type", func(e *outbox.Event) { e.AggregateType = "" }, "has no AggregateType"},
		{"no aggregate id or type", func(e *outbox.Event) { e.AggregateID, e.Type = "", "" }, "has no AggregateID, Type"},
		{"not JSON", func(e *outbox.Event) { e.Payload = []byte(`{"total": 12.5`) }, "not valid JSON"},
		{"header without a column", func(e *outbox.Event) { e.Headers = map[string]string{"tenant": "a"} }, `header "tenant" has no column in public.outbox (header columns: trace_id)`},
	} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		bad := good
		c.edit(&bad)
		_, err = w.WriteBatch(ctx, tx, []outbox.Event{good, bad})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
		if _, err := w.Write(ctx, tx, good); err != nil {
			t.Fatalf("%s: the transaction is not usable after the refusal: %v", c.name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, conn, "outbox"); n != 4 {
		t.Fatalf("%d rows, want the 4 good ones", n)
	}
	var trace string
	if err := conn.QueryRow(ctx, "SELECT trace_id FROM outbox LIMIT 1").Scan(&trace); err != nil || trace != "t-1" {
		t.Fatalf("trace_id %q, %v", trace, err)
	}
}

// TestWriteToAnotherLayout: a table of another schema and name with
// renamed columns, a header column, a tombstone and Delete: the rows are
// inserted (a trigger counts them) and deleted in the same transaction.
func TestWriteToAnotherLayout(t *testing.T) {
	t.Parallel()
	l := decoder.Layout{Schema: "app", Table: "events", HeaderColumns: []string{"tenant"},
		Columns: decoder.Columns{ID: "event_id", AggregateType: "kind", AggregateID: "key", Type: "event_type", Payload: "body"}}
	conn := setup(t, l)
	ctx := t.Context()
	if _, err := conn.Exec(ctx, `CREATE TABLE inserted (id uuid, body text, tenant text);
		CREATE FUNCTION count_insert() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO inserted VALUES (NEW.event_id, NEW.body, NEW.tenant); RETURN NEW; END $$;
		CREATE TRIGGER counted AFTER INSERT ON app.events FOR EACH ROW EXECUTE FUNCTION count_insert()`); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(outbox.Config{Layout: l, Delete: true})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := w.WriteBatch(ctx, tx, []outbox.Event{
		{AggregateType: "order", AggregateID: "o-1", Type: "OrderCreated", Payload: []byte(`{"a":1}`), Headers: map[string]string{"tenant": "acme"}},
		{AggregateType: "order", AggregateID: "o-1", Type: "OrderDeleted"}, // a tombstone
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, conn, "app.events"); n != 0 {
		t.Fatalf("%d rows left with Delete, want 0", n)
	}
	rows, err := conn.Query(ctx, "SELECT id::text, body, tenant FROM inserted ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		ID           string
		Body, Tenant *string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != ids[0] || got[0].Body == nil || *got[0].Body != `{"a": 1}` || *got[0].Tenant != "acme" || got[1].Body != nil || got[1].Tenant != nil {
		t.Fatalf("inserted rows: %+v", got)
	}
}

// TestNewIDIsOrderedAndUnique: ids of one process strictly increase, many
// within one millisecond.
func TestNewIDIsOrderedAndUnique(t *testing.T) {
	t.Parallel()
	last := ""
	for range 100000 {
		id := outbox.NewID()
		if id <= last {
			t.Fatalf("%s after %s", id, last)
		}
		if id[14] != '7' || !strings.ContainsRune("89ab", rune(id[19])) {
			t.Fatalf("%s is not a UUIDv7", id)
		}
		last = id
	}
}
