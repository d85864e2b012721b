package recovery

import (
	"testing"

	"github.com/walrelay/walrelay/decoder"
)

// TestCharColumnsKeptPadded: a char(n) (bpchar) aggregate id, aggregate
// type or type column is read by the poll source, replay and reconcile
// as pgoutput sends it and Debezium reads it, bpchar's output padded with
// blanks to n ("ab      "), also through a domain over char(n), and with
// the row size limit (LimitPayload, the capped select). PostgreSQL's cast
// of char(n) to text drops the trailing blanks, which gave the same row
// another key (another partition, another Avro key) by source, and a
// replay of WAL-sourced events other keys than the originals (the
// review's TestProbeCharAggregateIDKeptPadded).
func TestCharColumnsKeptPadded(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	conn := migratedConn(t)
	for _, stmt := range []string{
		`CREATE DOMAIN short_type AS char(12)`,
		`ALTER TABLE outbox ALTER aggregateid TYPE char(8), ALTER type TYPE short_type`,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', 'ab', 'T', '{}')`,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	var aggregateID, typ string
	if err := conn.QueryRow(ctx, `SELECT bpcharout(aggregateid)::text, bpcharout(type)::text FROM outbox`).Scan(&aggregateID, &typ); err != nil { // bpcharout, as pgoutput sends it
		t.Fatal(err)
	}
	if aggregateID != "ab      " || typ != "T           " {
		t.Fatalf("bpchar's output here: %q, %q", aggregateID, typ)
	}
	tb, err := Open(ctx, conn, decoder.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int64{0, 1 << 20} {
		tb.LimitPayload(limit)
		var got [][2]string
		if err := tb.Rows(ctx, nil, Window{All: true}, func(r Row) error {
			got = append(got, [2]string{r.Event.AggregateID, r.Event.Type})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0] != [2]string{aggregateID, typ} {
			t.Errorf("row size limit %d: the char(8) aggregate id 'ab' and the type 'T' (a domain over char(12)) read as %q; pgoutput (the WAL source, Debezium: bpcharout) gives %q, %q: the key differs by source", limit, got, aggregateID, typ)
		}
	}
}
