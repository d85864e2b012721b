package migrations

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/sqlquote"
)

// PollNames are the names of what ApplyPoll creates for an outbox table:
// its indexes, the status check, the trigger and the trigger's function.
type PollNames struct {
	DueIndex, UnsentIndex, ParkedIndex, StatusCheck, Trigger, Function string
}

// PollNamesOf returns the names of the poll objects of layout l.
func PollNamesOf(l decoder.Layout) PollNames {
	return PollNames{
		DueIndex:    l.Table + "_walrelay_due",
		UnsentIndex: l.Table + "_walrelay_unsent",
		ParkedIndex: l.Table + "_walrelay_parked",
		StatusCheck: l.Table + "_walrelay_status",
		Trigger:     "walrelay_poll_notify",
		Function:    "walrelay_poll_notify",
	}
}

// pollSuffixes are what PollNamesOf adds to a table's name for the
// objects it names after the table.
func pollSuffixes() []string {
	n := PollNamesOf(decoder.Layout{})
	return []string{n.DueIndex, n.UnsentIndex, n.ParkedIndex, n.StatusCheck}
}

// CheckPollNames refuses an outbox table whose poll indexes
// (PollNamesOf) PostgreSQL would give one name: it keeps the first 63
// bytes of a name, so for a table of 53 bytes or more they all cut to
// <table>_walrelay_, and only the first is ever built (the others' CREATE
// INDEX IF NOT EXISTS finds it). A shorter table's names, cut or not,
// stay apart.
func CheckPollNames(l decoder.Layout) error {
	l = l.WithDefaults()
	n := PollNamesOf(l)
	seen := map[string]string{}
	for _, x := range []string{n.DueIndex, n.UnsentIndex, n.ParkedIndex} {
		cut := sqlquote.Cut(x)
		if other, ok := seen[cut]; ok {
			return fmt.Errorf("outbox table %q: the poll source names its indexes after the table (%s, %s, …), and PostgreSQL keeps the first %d bytes of a name, so they would share the name %s and only one would be built: the poll source takes a table name of at most %d bytes; rename the table (ALTER TABLE … RENAME TO …)",
				// The names differ after <table>_walrelay_: at least one
				// byte of what follows must be kept.
				l.Name(), other, x, sqlquote.MaxNameBytes, cut, sqlquote.MaxNameBytes-len("_walrelay_")-1)
		}
		seen[cut] = x
	}
	return nil
}

// nameFree refuses a relation name (an index to build, cut as PostgreSQL
// cuts it) that another relation of schema holds already: the index's
// CREATE INDEX IF NOT EXISTS would find that one and build nothing.
func nameFree(ctx context.Context, tx pgx.Tx, schema, name string) error {
	cut := sqlquote.Cut(name)
	var holder *string
	if err := tx.QueryRow(ctx, `SELECT c.relname::text || ' (' || c.relkind::text || coalesce(', on ' || i.indrelid::regclass::text, '') || ')'
		FROM pg_class c LEFT JOIN pg_index i ON i.indexrelid = c.oid WHERE c.relnamespace = to_regnamespace($1) AND c.relname = $2`,
		pgx.Identifier{schema}.Sanitize(), cut).Scan(&holder); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("look up the name %s: %w", cut, err)
	}
	if holder != nil {
		return fmt.Errorf("its name %s (%s as PostgreSQL keeps it, 63 bytes at most) is held by %s already in schema %s, so it would not be built: rename the table, or that relation", name, cut, *holder, schema)
	}
	return nil
}
