package recovery

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/migrations"
)

// serverConn gives a test a server and a connection to it, closed when the
// test ends.
func serverConn(t *testing.T) (*pgtest.Server, *pgx.Conn) {
	t.Helper()
	pg := pgtest.Start(t)
	return pg, pgtest.Connect(t, pg.DSN)
}

// migratedConn is serverConn's connection to a database walrelay migrate
// prepared (its outbox table).
func migratedConn(t *testing.T) *pgx.Conn {
	t.Helper()
	_, conn := serverConn(t)
	if _, err := migrations.Apply(t.Context(), conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestReplayOrderOfPolledRows: the poll source updates the rows it sends
// (status, lease, sent_at), which gives them the transaction id, command
// id and place of the update: a row sent after a retry, behind later rows
// of its aggregate, would replay after them by transaction id. The table
// has migrate --poll's created_at, the poll source's own insert order: the
// replay follows it.
func TestReplayOrderOfPolledRows(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	conn := migratedConn(t)
	if _, err := migrations.ApplyPoll(ctx, conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
	for n := range 4 { // one transaction each, as an application writes them
		if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
			VALUES (gen_random_uuid(), 'order', 'o-1', 'T', jsonb_build_object('n', $1::int))`, n); err != nil {
			t.Fatal(err)
		}
	}
	// The poll source sent 1, 2 and 3 first, and 0 after a retry.
	for _, set := range []string{`(payload->>'n')::int > 0`, `(payload->>'n')::int = 0`} {
		if _, err := conn.Exec(ctx, `UPDATE outbox SET status = 'SENT', sent_at = clock_timestamp() WHERE `+set); err != nil {
			t.Fatal(err)
		}
	}
	tb, err := Open(ctx, conn, decoder.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	order, err := tb.Order(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	if err := tb.Rows(ctx, nil, Window{All: true}, func(r Row) error {
		got = append(got, strings.TrimSpace(string(r.Event.Payload)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if s := strings.Join(got, " "); s != `{"n": 0} {"n": 1} {"n": 2} {"n": 3}` {
		t.Fatalf("replayed in the order %s (order: %s); want n 0, 1, 2, 3, the insert order", s, order.By)
	}
	if !strings.Contains(order.By, "created_at") {
		t.Fatalf("order: %s; want it to name created_at", order.By)
	}
}

// TestFirstWroteOrder: the last-resort order, by the transaction id that
// first wrote each row, older first. age(xmin) is wrong for rows older
// than 2^31 transactions (frozen, their age wraps to a negative number,
// which sorted them as the newest) and for rows frozen to the permanent
// xid 2 (pg_upgrade from before 9.4): the key sorts those first. A row
// that old cannot be written by a test, so the key is tried on the xids
// such rows carry.
func TestFirstWroteOrder(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, conn := serverConn(t)
	// The 32-bit xid of d transactions ago.
	ago := func(d int64) string {
		return fmt.Sprintf("((((txid_current() - %d) %% 4294967296) + 4294967296) %% 4294967296)::text::xid", d)
	}
	rows := []struct{ name, xid string }{ // oldest first
		{"frozen to xid 2", "'2'::xid"},
		{"3e9 transactions ago", ago(3_000_000_000)},
		{"2^31+5 transactions ago", ago(1<<31 + 5)},
		{"1e9 transactions ago", ago(1_000_000_000)},
		{"5 transactions ago", ago(5)},
	}
	var values []string
	for i, r := range rows {
		values = append(values, fmt.Sprintf("(%d, %s)", i, r.xid))
	}
	q := "SELECT i FROM (VALUES " + strings.Join(values, ", ") + ") v(i, x) ORDER BY " + firstWrote("v.x")
	rs, err := conn.Query(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rs, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range got {
		if r != i {
			var names []string
			for _, r := range got {
				names = append(names, rows[r].name)
			}
			t.Fatalf("ordered %s; want oldest first", strings.Join(names, ", "))
		}
	}
}

// TestRowsLeaveOutLargeColumns: with LimitPayload, a row whose columns
// together are over the limit is read without them and is too_large,
// whichever column is large (a header column here, the payload small).
func TestRowsLeaveOutLargeColumns(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	conn := migratedConn(t)
	if _, err := conn.Exec(ctx, `ALTER TABLE outbox ADD COLUMN tenant text;
		INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, tenant)
		VALUES (gen_random_uuid(), 'order', 'o-1', 'T', '{}', repeat('k', 5000)), (gen_random_uuid(), 'order', 'o-2', 'T', '{}', 'small')`); err != nil {
		t.Fatal(err)
	}
	tb, err := Open(ctx, conn, decoder.Layout{HeaderColumns: []string{"tenant"}})
	if err != nil {
		t.Fatal(err)
	}
	tb.LimitPayload(1000)
	n := 0
	if err := tb.Rows(ctx, nil, Window{All: true}, func(r Row) error {
		n++
		e := r.Event
		large := e.AggregateID == "o-1"
		if got := errors.Is(e.Invalid, event.ErrTooLarge); got != large {
			return fmt.Errorf("row %s: too_large %v (%v), want %v", e.AggregateID, got, e.Invalid, large)
		}
		for _, h := range e.Headers {
			if len(h.Value) > 1000 {
				return fmt.Errorf("row %s: header %s of %d bytes read", e.AggregateID, h.Key, len(h.Value))
			}
		}
		if large && (e.OmittedBytes < 5000 || e.ID == "" || e.AggregateType != "order" || e.Type != "T") {
			return fmt.Errorf("the large row: omitted %d bytes, id %q, aggregate type %q, type %q", e.OmittedBytes, e.ID, e.AggregateType, e.Type)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d rows read, want 2", n)
	}
}
