package poll

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/recovery"
)

// serverConn gives a test a server and a connection to it, closed when the
// test ends.
func serverConn(t testing.TB) *pgx.Conn {
	t.Helper()
	return pgtest.Connect(t, pgtest.Start(t).DSN)
}

// insertCreatedPaid writes the rows "created" and "paid" of aggregate o-1
// in that order in one transaction, the id of paid sorting first.
func insertCreatedPaid(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	ctx := t.Context()
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, r := range [][2]string{{"ffffffff-0000-4000-8000-000000000000", "created"}, {"00000000-0000-4000-8000-000000000000", "paid"}} {
			if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'o-1', $2, '{}')", r[0], r[1]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// claimAggregate claims one batch of the table of layout l, ordered by
// aggregate.
func claimAggregate(t *testing.T, conn *pgx.Conn, l decoder.Layout) []*row {
	t.Helper()
	rt, err := recovery.Open(t.Context(), conn, l)
	if err != nil {
		t.Fatal(err)
	}
	tb := newTable(rt, Config{Ordering: OrderAggregate, OnDead: DeadSkip, BatchSize: 100, MaxBatchBytes: 1 << 20, MaxEventBytes: 1 << 20, Lease: 30e9})
	rows, _, err := tb.claim(t.Context(), conn, "w:1")
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// claimFixture is an outbox with the poll columns on a real PostgreSQL,
// and the statements of a poller with cfg's ordering rules.
func claimFixture(t testing.TB, cfg Config) (*pgx.Conn, *table) {
	t.Helper()
	conn := serverConn(t)
	ctx := t.Context()
	if _, err := migrations.Apply(ctx, conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.ApplyPoll(ctx, conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
	rt, err := recovery.Open(ctx, conn, decoder.Config{}.WithDefaults().Layouts()[0])
	if err != nil {
		t.Fatal(err)
	}
	cfg.BatchSize = max(cfg.BatchSize, 100)
	if cfg.MaxBatchBytes == 0 {
		cfg.MaxBatchBytes = 8 << 20
	}
	cfg.Lease = 30e9
	return conn, newTable(rt, cfg)
}

// insert writes rows "<agg>-<n>" (aggregate agg, n its next number) in
// order, one statement each, and adds their ids to ids by name.
func insert(t *testing.T, conn *pgx.Conn, ids map[string]string, aggs ...string) {
	t.Helper()
	for _, agg := range aggs {
		n := 0
		for ids[fmt.Sprintf("%s-%d", agg, n)] != "" {
			n++
		}
		name := fmt.Sprintf("%s-%d", agg, n)
		var id string
		if err := conn.QueryRow(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', $1, 'T', $2) RETURNING id::text",
			agg, fmt.Sprintf(`{"name": %q}`, name)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[name] = id
	}
}

// claimNames releases the parked rows that may go and claims with tb, as
// a round does, and returns the claimed rows' names, in order.
func claimNames(t *testing.T, conn *pgx.Conn, tb *table, claim string, ids map[string]string) []string {
	t.Helper()
	if _, err := tb.release(t.Context(), conn); err != nil {
		t.Fatal(err)
	}
	rows, _, err := tb.claim(t.Context(), conn, claim)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rows {
		for name, id := range ids {
			if id == r.id {
				out = append(out, name)
			}
		}
	}
	return out
}

func set(t *testing.T, conn *pgx.Conn, id, assignments string) {
	t.Helper()
	if _, err := conn.Exec(t.Context(), "UPDATE outbox SET "+assignments+" WHERE id = $1", id); err != nil {
		t.Fatal(err)
	}
}

// TestClaimOrder checks the claim's rules on a real server: insert order;
// an aggregate held by an earlier row that is not due (in backoff, under a
// live lease, DEAD with on_dead block), while other aggregates go on; a DEAD
// row passed over with on_dead skip; an expired lease claimed again; and an
// earlier row locked by another claim, which holds its aggregate's later
// rows (SKIP LOCKED must not let them overtake).
func TestClaimOrder(t *testing.T) {
	t.Parallel()
	for _, onDead := range []string{DeadSkip, DeadBlock} {
		t.Run(onDead, func(t *testing.T) {
			t.Parallel()
			conn, tb := claimFixture(t, Config{Ordering: OrderAggregate, OnDead: onDead})
			ids := map[string]string{}
			insert(t, conn, ids, "a", "b", "a", "c", "a")
			if got, want := claimNames(t, conn, tb, "w:1", ids), []string{"a-0", "b-0", "a-1", "c-0", "a-2"}; !slices.Equal(got, want) {
				t.Fatalf("first claim %v, want %v", got, want)
			}
			// a-0 failed and backs off; a-1, a-2 went back (collateral).
			set(t, conn, ids["a-0"], "status = 'PENDING', available_at = now() + interval '1 hour'")
			set(t, conn, ids["a-1"], "status = 'PENDING'")
			set(t, conn, ids["a-2"], "status = 'PENDING'")
			set(t, conn, ids["b-0"], "status = 'SENT'")
			set(t, conn, ids["c-0"], "status = 'SENT'")
			insert(t, conn, ids, "b", "d")
			if got, want := claimNames(t, conn, tb, "w:2", ids), []string{"b-1", "d-0"}; !slices.Equal(got, want) {
				t.Fatalf("with a-0 in backoff: claimed %v, want %v", got, want)
			}
			// A live lease holds its aggregate too; an expired one is
			// claimed again, ahead of the rows behind it.
			set(t, conn, ids["b-1"], "status = 'SENDING', lease_until = now() + interval '1 hour'")
			set(t, conn, ids["d-0"], "status = 'SENDING', lease_until = now() - interval '1 second'")
			insert(t, conn, ids, "b", "d")
			if got, want := claimNames(t, conn, tb, "w:3", ids), []string{"d-0", "d-1"}; !slices.Equal(got, want) {
				t.Fatalf("b-1 under a live lease, d-0's expired: claimed %v, want %v", got, want)
			}
			// a-0 DEAD: skip lets a-1 and a-2 go; block holds them.
			set(t, conn, ids["a-0"], "status = 'DEAD'")
			set(t, conn, ids["b-1"], "status = 'SENT'")
			want := []string{"a-1", "a-2", "b-2"}
			if onDead == DeadBlock {
				want = []string{"b-2"}
			}
			if got := claimNames(t, conn, tb, "w:4", ids); !slices.Equal(got, want) {
				t.Fatalf("a-0 DEAD, on_dead %s: claimed %v, want %v", onDead, got, want)
			}
		})
	}
}

// TestClaimSkipsLockedRowsInOrder: a row locked by another claim's
// transaction is skipped, and so is every later row of its aggregate; the
// other aggregates are claimed.
func TestClaimSkipsLockedRowsInOrder(t *testing.T) {
	t.Parallel()
	conn, tb := claimFixture(t, Config{Ordering: OrderAggregate})
	ids := map[string]string{}
	insert(t, conn, ids, "a", "b", "a", "b")
	other, err := pgx.ConnectConfig(t.Context(), conn.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	tx, err := other.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // the test's lock
	if _, err := tx.Exec(t.Context(), "SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE", ids["a-0"]); err != nil {
		t.Fatal(err)
	}
	if got, want := claimNames(t, conn, tb, "w:1", ids), []string{"b-0", "b-1"}; !slices.Equal(got, want) {
		t.Fatalf("a-0 locked elsewhere: claimed %v, want %v", got, want)
	}
}

// TestClaimWithoutOrdering: ordering none claims every due row, whatever
// its aggregate's earlier rows.
func TestClaimWithoutOrdering(t *testing.T) {
	t.Parallel()
	conn, tb := claimFixture(t, Config{Ordering: OrderNone})
	ids := map[string]string{}
	insert(t, conn, ids, "a", "a", "a")
	set(t, conn, ids["a-0"], "status = 'PENDING', available_at = now() + interval '1 hour'")
	if got, want := claimNames(t, conn, tb, "w:1", ids), []string{"a-1", "a-2"}; !slices.Equal(got, want) {
		t.Fatalf("ordering none: claimed %v, want %v", got, want)
	}
}

// TestClaimBoundedByBytes: a claim stops where its payloads pass
// MaxBatchBytes, taking at least one row.
func TestClaimBoundedByBytes(t *testing.T) {
	t.Parallel()
	conn, tb := claimFixture(t, Config{Ordering: OrderAggregate, MaxBatchBytes: 100})
	ids := map[string]string{}
	insert(t, conn, ids, "a", "b", "a", "b", "c")
	// A row's size is every column's text; the rows are nearly alike (uuid ids,
	// one-letter aggregates, names "x-n").
	var size int64
	if err := conn.QueryRow(t.Context(), "SELECT max("+recovery.SizeSQL(strings.Split(tb.rt.SelectList(), ", "))+") FROM outbox").Scan(&size); err != nil {
		t.Fatal(err)
	}
	tb.maxBytes = 2*size + 1 // three rows start below it
	if got, want := claimNames(t, conn, tb, "w:1", ids), []string{"a-0", "b-0", "a-1"}; !slices.Equal(got, want) {
		t.Fatalf("claimed %v, want %v", got, want)
	}
	tb.maxBytes = 1 // the first row always goes (b-1 waits for b-0, claimed above)
	if got, want := claimNames(t, conn, tb, "w:2", ids), []string{"c-0"}; !slices.Equal(got, want) {
		t.Fatalf("claimed %v, want %v", got, want)
	}
}

// TestClaimLeavesOutLargeColumns: a row whose columns together are over
// MaxEventBytes is claimed without them and dead-lettered too_large,
// whichever column is large (a header column here, the payload small):
// the claim measures every column it reads, so one row is never held.
func TestClaimLeavesOutLargeColumns(t *testing.T) {
	t.Parallel()
	conn, _ := claimFixture(t, Config{})
	if _, err := conn.Exec(t.Context(), "ALTER TABLE outbox ADD COLUMN tenant text"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, tenant)
		VALUES (gen_random_uuid(), 'order', 'o-1', 'T', '{}', repeat('k', 5000)), (gen_random_uuid(), 'order', 'o-2', 'T', '{}', 'small')`); err != nil {
		t.Fatal(err)
	}
	l := decoder.Config{}.WithDefaults().Layouts()[0]
	l.HeaderColumns = []string{"tenant"}
	rt, err := recovery.Open(t.Context(), conn, l)
	if err != nil {
		t.Fatal(err)
	}
	tb := newTable(rt, Config{BatchSize: 100, MaxBatchBytes: 8 << 20, MaxEventBytes: 1000, Lease: 30e9})
	rows, _, err := tb.claim(t.Context(), conn, "w:1")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("claimed %d rows, want 2", len(rows))
	}
	for _, r := range rows {
		large := r.e.AggregateID == "o-1"
		if got := errors.Is(r.e.Invalid, event.ErrTooLarge); got != large {
			t.Fatalf("row %s: too_large %v (%v), want %v", r.e.AggregateID, got, r.e.Invalid, large)
		}
		for _, h := range r.e.Headers {
			if len(h.Value) > 1000 {
				t.Fatalf("row %s: header %s of %d bytes read", r.e.AggregateID, h.Key, len(h.Value))
			}
		}
		if large && (r.e.OmittedBytes < 5000 || r.e.ID == "" || r.e.AggregateType != "order" || r.e.Type != "T") {
			t.Fatalf("the large row: omitted %d bytes, id %q, aggregate type %q, type %q", r.e.OmittedBytes, r.e.ID, r.e.AggregateType, r.e.Type)
		}
	}
}
