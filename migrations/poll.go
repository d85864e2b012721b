package migrations

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/sqlquote"
)

// The poll source's columns (`walrelay migrate --poll`), with the types and
// defaults they get. Applications insert rows as before: every column has a
// default.
var PollColumns = []struct{ Name, Type, Default string }{
	{"status", "text", "'PENDING'"},          // PENDING, SENDING, SENT, DEAD
	{"attempts", "integer", "0"},             // claims so far
	{"available_at", "timestamptz", "now()"}, // not claimed before
	{"claim_id", "text", ""},                 // the lease token: worker id and claim number
	{"lease_until", "timestamptz", ""},       // a SENDING row's lease ends
	{"last_error", "text", ""},               // why the last attempt failed
	{"created_at", "timestamptz", "now()"},   // insert order (with the id as a tie-break)
	{"sent_at", "timestamptz", ""},           // Kafka acknowledged it
}

// PollStatuses are the values of the status column.
var PollStatuses = []string{"PENDING", "SENDING", "SENT", "DEAD"}

// NotifyChannel is the channel the poll trigger notifies on insert, with
// the table (schema.table) as the payload.
const NotifyChannel = "walrelay_outbox"

// PollNames are the names of what ApplyPoll creates for an outbox table:
// its indexes, the status check, the trigger and the trigger's function.
type PollNames struct {
	DueIndex, UnsentIndex, StatusCheck, Trigger, Function string
}

// PollNamesOf returns the names of the poll objects of layout l.
func PollNamesOf(l decoder.Layout) PollNames {
	return PollNames{
		DueIndex:    l.Table + "_walrelay_due",
		UnsentIndex: l.Table + "_walrelay_unsent",
		StatusCheck: l.Table + "_walrelay_status",
		Trigger:     "walrelay_poll_notify",
		Function:    "walrelay_poll_notify",
	}
}

// PollResult says what ApplyPoll added, per table (schema.table).
type PollResult struct {
	Added   map[string][]string // columns added
	Pending map[string]int64    // rows that were there and are PENDING now
}

// ApplyPoll gives each outbox table of o the poll source's columns
// (PollColumns; a column that exists is kept if its type fits), a check of
// the status values, the partial indexes of the rows still to send (by
// insert order, and by aggregate), and a statement trigger that notifies
// NotifyChannel on insert; and makes walrelay_emit insert into the first
// table (the poll source reads no WAL messages). Run Apply first. One
// transaction, under the migrations' lock; re-running changes nothing.
func ApplyPoll(ctx context.Context, conn *pgx.Conn, o decoder.Config) (PollResult, error) {
	o = o.WithDefaults()
	res := PollResult{Added: map[string][]string{}, Pending: map[string]int64{}}
	tx, err := begin(ctx, conn)
	if err != nil {
		return res, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	for i, l := range o.Layouts() {
		name := pgx.Identifier{l.Schema, l.Table}.Sanitize()
		have := map[string]string{}
		rows, err := tx.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
			WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`, name)
		if err != nil {
			return res, fmt.Errorf("read the columns of %s: %w", l.Name(), err)
		}
		for rows.Next() {
			var n, t string
			if err := rows.Scan(&n, &t); err != nil {
				return res, err
			}
			have[n] = t
		}
		if err := rows.Err(); err != nil {
			return res, fmt.Errorf("read the columns of %s: %w", l.Name(), err)
		}
		if len(have) == 0 {
			return res, fmt.Errorf("table %s does not exist", l.Name())
		}
		var adds []string
		for _, c := range PollColumns {
			t, ok := have[c.Name]
			if ok {
				if !pollTypeFits(c.Type, t) {
					return res, fmt.Errorf("table %s has a column %s of type %s: the poll source needs it as %s (rename the column, or use another table)", l.Name(), c.Name, t, c.Type)
				}
				continue
			}
			def := ""
			if c.Default != "" {
				def = " NOT NULL DEFAULT " + c.Default
			}
			adds = append(adds, "ADD COLUMN "+pgx.Identifier{c.Name}.Sanitize()+" "+c.Type+def)
			res.Added[l.Name()] = append(res.Added[l.Name()], c.Name)
		}
		if len(adds) > 0 {
			if _, ok := have["status"]; !ok {
				var n int64
				if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+name).Scan(&n); err != nil {
					return res, fmt.Errorf("count the rows of %s: %w", l.Name(), err)
				}
				res.Pending[l.Name()] = n
			}
			if _, err := tx.Exec(ctx, "ALTER TABLE "+name+" "+strings.Join(adds, ", ")); err != nil {
				return res, fmt.Errorf("add the poll columns to %s: %w", l.Name(), err)
			}
		}
		if _, ok := have["created_at"]; !ok {
			// Rows that were there share the migration's time (their ids
			// order them); each new row gets the time of its insert. A
			// volatile default on ADD COLUMN would rewrite the table.
			if _, err := tx.Exec(ctx, "ALTER TABLE "+name+" ALTER COLUMN created_at SET DEFAULT clock_timestamp()"); err != nil {
				return res, fmt.Errorf("set the default of %s.created_at: %w", l.Name(), err)
			}
		}
		n := PollNamesOf(l)
		id, agg := pgx.Identifier{l.Columns.ID}.Sanitize(), pgx.Identifier{l.Columns.AggregateID}.Sanitize()
		statuses := "'" + strings.Join(PollStatuses, "', '") + "'"
		stmts := []string{
			`DO ` + sqlquote.Dollar(` BEGIN
				IF NOT EXISTS (SELECT FROM pg_constraint WHERE conrelid = `+quoteLiteral(name)+`::regclass AND conname = `+quoteLiteral(n.StatusCheck)+`) THEN
					ALTER TABLE `+name+` ADD CONSTRAINT `+pgx.Identifier{n.StatusCheck}.Sanitize()+` CHECK (status IN (`+statuses+`));
				END IF;
			END `),
			"CREATE INDEX IF NOT EXISTS " + pgx.Identifier{n.DueIndex}.Sanitize() + " ON " + name + " (created_at, " + id + ") WHERE status IN ('PENDING', 'SENDING')",
			"CREATE INDEX IF NOT EXISTS " + pgx.Identifier{n.UnsentIndex}.Sanitize() + " ON " + name + " (" + agg + ", created_at, " + id + ") WHERE status <> 'SENT'",
			"CREATE OR REPLACE FUNCTION " + pgx.Identifier{l.Schema, n.Function}.Sanitize() + `() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(` + quoteLiteral(NotifyChannel) + `, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    RETURN NULL;
END $$`,
			"CREATE OR REPLACE TRIGGER " + pgx.Identifier{n.Trigger}.Sanitize() + " AFTER INSERT ON " + name + " FOR EACH STATEMENT EXECUTE FUNCTION " + pgx.Identifier{l.Schema, n.Function}.Sanitize() + "()",
		}
		if i == 0 {
			// walrelay_emit may write a WAL message, which the poll source
			// never reads: it inserts a row instead.
			stmts = append(stmts, createEmit(l.Schema, EmitInsertSource(l)))
		}
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return res, fmt.Errorf("poll migration of %s: %w", l.Name(), err)
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("commit migrations: %w", err)
	}
	return res, nil
}

// pollTypeFits reports whether an existing column of type have serves as a
// poll column of type want.
func pollTypeFits(want, have string) bool {
	switch want {
	case "text":
		return have == "text" || strings.HasPrefix(have, "character varying")
	case "timestamptz":
		return have == "timestamp with time zone"
	case "integer":
		return have == "integer" || have == "bigint"
	}
	return false
}
