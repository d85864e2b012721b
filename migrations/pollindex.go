package migrations

import (
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
)

// PollIndex is one partial index of the poll source: its name and the
// statement that builds it (CREATE INDEX IF NOT EXISTS).
type PollIndex struct{ Schema, Name, Create string }

// Concurrently is the index's statement that builds it without blocking
// the table's writers (CREATE INDEX CONCURRENTLY, outside a transaction).
func (x PollIndex) Concurrently() string {
	return strings.Replace(x.Create, "CREATE INDEX", "CREATE INDEX CONCURRENTLY", 1)
}

// Rebuild is the index's statements that replace an INVALID index of its
// name (left by a failed CREATE INDEX CONCURRENTLY, which IF NOT EXISTS
// keeps) without blocking the table's writers: DROP INDEX CONCURRENTLY,
// then Concurrently.
func (x PollIndex) Rebuild() string {
	return "DROP INDEX CONCURRENTLY IF EXISTS " + x.schemaName() + "; " + x.Concurrently() + ";"
}

// schemaName is the index's quoted schema.name.
func (x PollIndex) schemaName() string {
	return pgx.Identifier{x.Schema, x.Name}.Sanitize()
}

// PollIndexes returns the poll source's indexes of layout l: the rows
// still to send by insert order (the claims), by aggregate (the order
// checks), and the parked rows by aggregate (the release).
func PollIndexes(l decoder.Layout) []PollIndex {
	l = l.WithDefaults()
	n := PollNamesOf(l)
	name := pgx.Identifier{l.Schema, l.Table}.Sanitize()
	id, agg := pgx.Identifier{l.Columns.ID}.Sanitize(), pgx.Identifier{l.Columns.AggregateID}.Sanitize()
	return []PollIndex{
		{l.Schema, n.DueIndex, "CREATE INDEX IF NOT EXISTS " + pgx.Identifier{n.DueIndex}.Sanitize() + " ON " + name + " (created_at, " + id + ") WHERE status IN ('PENDING', 'SENDING')"},
		{l.Schema, n.UnsentIndex, "CREATE INDEX IF NOT EXISTS " + pgx.Identifier{n.UnsentIndex}.Sanitize() + " ON " + name + " (" + agg + ", created_at, " + id + ") WHERE status <> 'SENT'"},
		{l.Schema, n.ParkedIndex, "CREATE INDEX IF NOT EXISTS " + pgx.Identifier{n.ParkedIndex}.Sanitize() + " ON " + name + " (" + agg + ", created_at, " + id + ") WHERE status = 'PARKED'"},
	}
}
