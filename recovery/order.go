package recovery

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Order is the order in which Rows reads a table: the order its rows were
// committed in, as far as the table can tell.
type Order struct {
	// By says what the order rests on, for the operator.
	By string
	// Unsure, if set, says why rows of one aggregate may still go out in
	// another order than they were committed in.
	Unsure string

	sql string // the ORDER BY list
}

// Order is the order of the table's rows that Rows reads them in. An
// order column is taken as it is; else the timestamp column or the time of
// UUIDv7 ids orders the transactions, and the command id and then the
// tuple's place order a transaction's rows (the order its statements ran
// and, within one statement, the order it inserted them in an outbox whose
// rows are never updated). A table with the poll source's columns has its
// rows updated by the poll source, which gives them the update's
// transaction id, command id and place: its created_at (the time of each
// row's insert), then the id, take their place. A table with none of these
// is ordered by transaction id, which is the order transactions first
// wrote, not always the order they committed.
func (t *Table) Order(ctx context.Context) (Order, error) {
	id := t.name + "." + pgx.Identifier{t.layout.Columns.ID}.Sanitize()
	// cid has no ordering operator; its text is its number.
	inTx, inTxBy := t.name+".cmin::text::int8, "+t.name+".ctid", "insert order"
	wrote, wroteBy := firstWrote(t.name+".xmin")+", "+inTx, "transaction id, then insert order"
	if t.polled {
		inTx = t.name + "." + pgx.Identifier{"created_at"}.Sanitize() + ", " + id
		inTxBy = "created_at (the poll source's insert order), then id"
		wrote, wroteBy = inTx, inTxBy
	}
	const updated = "a row updated after its insert goes out as of its update (the transaction id and place are the update's)"
	switch {
	case t.layout.OrderColumn != "":
		return Order{By: "outbox.order_column " + t.layout.OrderColumn, sql: t.name + "." + pgx.Identifier{t.layout.OrderColumn}.Sanitize() + ", " + id}, nil
	case t.tsColumn != "" && t.tsIsDate:
		unsure := "the timestamp column is a date: rows of one day go out in the order their transactions first wrote, not always the order they committed, " + updated + "; set outbox.order_column"
		if t.polled {
			unsure = "the timestamp column is a date: rows of one day go out in the order they were inserted (created_at), not always the order they committed; set outbox.order_column"
		}
		return Order{By: "outbox.timestamp_column " + t.tsColumn + ", then " + wroteBy, Unsure: unsure,
			sql: t.name + "." + pgx.Identifier{t.tsColumn}.Sanitize() + ", " + wrote}, nil
	case t.tsColumn != "":
		return Order{By: "outbox.timestamp_column " + t.tsColumn + ", then " + inTxBy, sql: t.name + "." + pgx.Identifier{t.tsColumn}.Sanitize() + ", " + inTx}, nil
	}
	v7, _, err := t.uuidV7(ctx)
	if err != nil {
		return Order{}, err
	}
	if v7 {
		// Ids of a monotonic generator (PostgreSQL 18's uuidv7(),
		// outbox.NewID) rise in the order they were made.
		return Order{By: "UUIDv7 ids", sql: id}, nil
	}
	if t.polled {
		return Order{By: wroteBy,
			Unsure: "created_at is the time of each row's insert: two transactions of an aggregate that committed in another order than they inserted go out in the order they inserted (the poll source's order), and rows that were in the table before walrelay migrate --poll share one created_at and go out in id order; set outbox.order_column",
			sql:    wrote}, nil
	}
	return Order{By: wroteBy,
		Unsure: "the table has no outbox.timestamp_column, outbox.order_column or UUIDv7 ids: transactions go out in the order they first wrote, not always the order they committed, rows written under a savepoint after their transaction's others, " + updated + ", and rows written more than 2^32 (4.3 billion) transactions ago, which PostgreSQL has frozen, in no reliable order; set outbox.order_column",
		sql:    wrote}, nil
}

// firstWrote is an ORDER BY key of rows by the transaction id xmin (an
// expression of type xid) that first wrote them, oldest first: by
// age(xmin), the transactions since. A row older than 2^31 transactions is
// frozen and keeps its xmin, whose age wraps to a negative number: 2^32 is
// added back (right up to 2^32 transactions; beyond, the xid tells nothing).
// A row frozen to the permanent xid 2 (by PostgreSQL before 9.4) is the
// oldest.
func firstWrote(xmin string) string {
	age := "age(" + xmin + ")"
	return "CASE WHEN " + xmin + "::text::int8 < 3 THEN 9223372036854775807 WHEN " + age + " < 0 THEN " + age + "::int8 + 4294967296 ELSE " + age + " END DESC"
}
