package poll

import (
	"testing"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/recovery"
)

// TestClaimKeepsCharPadding: the poll source reads a char(n) aggregate id
// as pgoutput sends it (bpchar's output, padded with blanks to n), so a
// row's key is the same bytes from either source; in the claim and in the
// claim of a row over the size limit (its name columns kept). Its cast to
// text dropped the blanks (recovery's TestCharColumnsKeptPadded).
func TestClaimKeepsCharPadding(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	conn := serverConn(t)
	if _, err := migrations.Apply(ctx, conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.ApplyPoll(ctx, conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`ALTER TABLE outbox ALTER aggregateid TYPE char(8)`,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', 'ab', 'T', '{}')`,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', 'ab', 'T', jsonb_build_object('a', repeat('x', 2000)))`,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	rt, err := recovery.Open(ctx, conn, decoder.Config{}.WithDefaults().Layouts()[0])
	if err != nil {
		t.Fatal(err)
	}
	tb := newTable(rt, Config{Ordering: OrderAggregate, OnDead: DeadSkip, BatchSize: 100, MaxBatchBytes: 1 << 20, MaxEventBytes: 1000, Lease: 30e9})
	rows, _, err := tb.claim(ctx, conn, "w:1")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("%d rows claimed, want 2", len(rows))
	}
	for i, r := range rows {
		if r.e.AggregateID != "ab      " {
			t.Errorf("row %d: the char(8) aggregate id 'ab' claimed as %q, want %q (bpchar's output, as pgoutput sends it)", i, r.e.AggregateID, "ab      ")
		}
	}
}
