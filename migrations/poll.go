package migrations

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/sqlquote"
)

// The poll source's columns (`walrelay migrate --poll`), with the types and
// defaults they get. Applications insert rows as before: every column has a
// default.
var PollColumns = []struct{ Name, Type, Default string }{
	{"status", "text", "'PENDING'"},          // PENDING, SENDING, SENT, DEAD, PARKED
	{"attempts", "integer", "0"},             // claims so far
	{"available_at", "timestamptz", "now()"}, // not claimed before
	{"claim_id", "text", ""},                 // the lease token: worker id and claim number
	{"lease_until", "timestamptz", ""},       // a SENDING row's lease ends
	{"last_error", "text", ""},               // why the last attempt failed
	{"created_at", "timestamptz", "now()"},   // insert order (with the id as a tie-break)
	{"sent_at", "timestamptz", ""},           // Kafka acknowledged it
}

// PollStatuses are the values of the status column. PARKED is a PENDING
// row behind a blocked row of its aggregate (one in backoff, or DEAD under
// on_dead block): out of the index the claims walk until the rows before
// it are sent (package poll parks and releases them).
var PollStatuses = []string{"PENDING", "SENDING", "SENT", "DEAD", "PARKED"}

// NotifyChannel is the channel the poll trigger notifies on insert, with
// the table (schema.table) as the payload.
const NotifyChannel = "walrelay_outbox"

// PollResult says what ApplyPoll added, per table (schema.table).
type PollResult struct {
	Added   map[string][]string // columns added
	Pending map[string]int64    // rows that were there and are PENDING now
	// Redefaulted holds, for a created_at column that was there with a
	// transaction-time default (TransactionTime), that default: ApplyPoll
	// set it to clock_timestamp().
	Redefaulted map[string]string
	// Sent holds, for a table given the status column over rows it held
	// with PollOptions.ExistingRows sent, how many: they are SENT.
	Sent map[string]int64
	// Stamped holds, for a table given the status column over rows it
	// held with PollOptions.ExistingRows pending, how many of those rows
	// had their created_at moved apart (StampTies).
	Stamped map[string]int64
	// Tied holds, for a table whose created_at default was redefaulted,
	// how many unsent rows share their created_at with another unsent row
	// of their aggregate: the claims order those by id.
	Tied map[string]int64
	// Unbuilt holds, for a table too large to index in the migration (the
	// build would hold its writers), the statements that build its
	// missing poll indexes without blocking them (PollIndexes), to run by
	// hand: the poll source refuses the table until they are built.
	Unbuilt map[string][]string
}

// The values of PollOptions.ExistingRows.
const (
	// ExistingSent: the rows a table holds when it gets the status column
	// were published already (by the WAL source, or another relay): they
	// become SENT (sent_at the migration's time), without a rewrite.
	ExistingSent = "sent"
	// ExistingPending: the poll source sends them. Rows of one aggregate
	// that share a created_at (CreatedAtUnknown, or one transaction's
	// now()) are stamped apart first (StampTies).
	ExistingPending = "pending"
)

// PollOptions are the choices of ApplyPollWith.
type PollOptions struct {
	// ExistingRows says what the rows a table holds when ApplyPollWith
	// adds its status column are: ExistingSent or ExistingPending. Empty
	// (the default) refuses such a table: their order is not known, and
	// whether they were sent is the operator's knowledge.
	ExistingRows string
}

// ExistingRowsError is ApplyPollWith's refusal of a table with rows and no
// status column when PollOptions.ExistingRows is empty.
type ExistingRowsError struct {
	Table string
	Rows  int64
}

func (e *ExistingRowsError) Error() string {
	return fmt.Sprintf("table %s holds %d rows and gets the status column now: say what they are, with --existing-rows sent (the WAL source or another relay published them: they become SENT) or --existing-rows pending (the poll source sends them; rows of one aggregate that share a created_at are ordered by their physical insertion order, which holds for a table only ever inserted into); migrate changed nothing", e.Table, e.Rows)
}

// StampTies is the statement that moves apart the created_at of rows of
// one aggregate that share it (rows there before created_at existed, at
// CreatedAtUnknown, or one transaction's rows under a default of now()):
// each takes a distinct, increasing microsecond after the shared time, in
// the order of their insertion as the table shows it: the age of the
// transaction that wrote the row (xmin), then its place in the table
// (ctid). That is the insertion order for a table only ever inserted into;
// an UPDATE or DELETE followed by VACUUM lets a later row take an earlier
// place. Rows at CreatedAtUnknown stay within CreatedAtUnknownSpan. q is
// the quoted table, agg and id its quoted columns.
func StampTies(q, agg, id string) string {
	return `WITH g AS (
		SELECT ` + id + ` AS _wr_id, created_at AS _wr_at,
			row_number() OVER (PARTITION BY ` + agg + `, created_at ORDER BY age(xmin) DESC, ctid) - 1 AS _wr_k,
			count(*) OVER (PARTITION BY ` + agg + `, created_at) AS _wr_n
		FROM ` + q + `
	)
	UPDATE ` + q + ` t SET created_at = g._wr_at + g._wr_k * interval '1 microsecond'
	FROM g WHERE g._wr_n > 1 AND g._wr_k > 0 AND t.` + id + ` = g._wr_id AND t.created_at = g._wr_at`
}

// stampOverlapSQL counts the groups of tied rows whose stamps would reach
// the next created_at of their aggregate (the order would change).
func stampOverlapSQL(q, agg string) string {
	return `SELECT count(*) FROM (SELECT created_at, count(*) AS n, lead(created_at) OVER (PARTITION BY ` + agg + ` ORDER BY created_at) AS nxt
		FROM ` + q + ` GROUP BY ` + agg + `, created_at) s
		WHERE s.n > 1 AND s.nxt IS NOT NULL AND s.created_at + (s.n - 1) * interval '1 microsecond' >= s.nxt`
}

// lockTimeout is the error ApplyPoll returns when a table's lock was not
// free within createdAtLockWait, or err.
func lockTimeout(err error, what, table string) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "55P03" {
		return fmt.Errorf("%s of %s: the table's lock was not free within %s (a long transaction uses it); migrate changed nothing: run it again when the table is quieter", what, table, createdAtLockWait)
	}
	return fmt.Errorf("%s of %s: %w", what, table, err)
}

// TransactionTime reports whether def, a column default as pg_get_expr
// writes it, is the time of the transaction or of the statement (now(),
// CURRENT_TIMESTAMP, transaction_timestamp(), statement_timestamp(),
// LOCALTIMESTAMP): every row of one transaction (or one statement) gets
// the same created_at, and the poll source, which orders an aggregate's
// rows by created_at, would fall back on their ids. created_at must
// default to clock_timestamp(), the time of each row's insert.
func TransactionTime(def string) bool {
	d := strings.ToLower(def)
	for _, f := range []string{"now()", "current_timestamp", "transaction_timestamp()", "statement_timestamp()", "localtimestamp"} {
		if strings.Contains(d, f) {
			return true
		}
	}
	return false
}

// ColumnDefault returns the default of column col of table (quoted
// schema.table), as pg_get_expr writes it, or "" when it has none.
func ColumnDefault(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table, col string) (string, error) {
	var def *string
	err := q.QueryRow(ctx, `SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a
		LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND NOT a.attisdropped`, table, col).Scan(&def)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && def == nil {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the default of %s.%s: %w", table, col, err)
	}
	return *def, nil
}

// ApplyPoll gives each outbox table of o the poll source's columns
// (PollColumns; a column that exists is kept if its type fits), a check of
// the status values (PollStatuses; a check of an earlier version, without
// PARKED, is replaced), the partial indexes of the rows still to send (by
// insert order, and by aggregate) and of the parked rows (by aggregate),
// and a statement trigger that notifies
// NotifyChannel on insert; and makes walrelay_emit insert into the first
// table (the poll source reads no WAL messages). Run Apply first. One
// transaction, under the migrations' lock; re-running changes nothing.
//
// A table that holds rows and lacks the status column is refused: see
// ApplyPollWith.
func ApplyPoll(ctx context.Context, conn *pgx.Conn, o decoder.Config) (PollResult, error) {
	return ApplyPollWith(ctx, conn, o, PollOptions{})
}

// ApplyPollWith is ApplyPoll with opts. A table that holds rows and gets
// the status column now is refused (ExistingRowsError) unless
// opts.ExistingRows says what its rows are: ExistingSent makes them SENT;
// ExistingPending leaves them PENDING, and stamps apart the created_at of
// those of one aggregate that share it (StampTies), refusing the table
// when a stamp would reach the aggregate's next time.
func ApplyPollWith(ctx context.Context, conn *pgx.Conn, o decoder.Config, opts PollOptions) (PollResult, error) {
	o = o.WithDefaults()
	switch opts.ExistingRows {
	case "", ExistingSent, ExistingPending:
	default:
		return PollResult{}, fmt.Errorf("existing rows %q: want %q or %q", opts.ExistingRows, ExistingSent, ExistingPending)
	}
	res := PollResult{Added: map[string][]string{}, Pending: map[string]int64{}, Redefaulted: map[string]string{}, Unbuilt: map[string][]string{}, Sent: map[string]int64{}, Stamped: map[string]int64{}, Tied: map[string]int64{}}
	if err := checkNames(o); err != nil {
		return res, err
	}
	tx, err := begin(ctx, conn)
	if err != nil {
		return res, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	// Each statement on a table waits for its lock behind every
	// transaction that uses the table, and the application's writes
	// queue behind that wait: it waits a bounded time, and migrate fails
	// (changing nothing) rather than stall the writers, as addCreatedAt.
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", createdAtLockWait.Milliseconds())); err != nil {
		return res, fmt.Errorf("poll migration: %w", err)
	}
	var validate [][2]string // table, statement
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
		if err := CheckPollNames(l); err != nil {
			return res, err
		}
		if _, ok := have["status"]; !ok {
			// The table gets the poll source's objects now, named after
			// it: none of their names may be cut. (A table that has them,
			// of a longer name, keeps working while its names stay
			// apart.)
			if err := sqlquote.CheckName(l.Table, pollSuffixes()...); err != nil {
				return res, fmt.Errorf("outbox table %q: %w", l.Name(), err)
			}
		}
		if len(have) == 0 {
			return res, fmt.Errorf("table %s does not exist", l.Name())
		}
		// The rows there when the status column is added: the operator says
		// whether they were sent (ExistingRows).
		var existing int64
		if _, ok := have["status"]; !ok {
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+name).Scan(&existing); err != nil {
				return res, fmt.Errorf("count the rows of %s: %w", l.Name(), err)
			}
			if existing > 0 && opts.ExistingRows == "" {
				return res, &ExistingRowsError{Table: l.Name(), Rows: existing}
			}
		}
		asSent := existing > 0 && opts.ExistingRows == ExistingSent
		if asSent {
			res.Sent[l.Name()] = existing
		}
		var adds, after []string
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
			// Rows that were sent: status SENT and sent_at the migration's
			// time, constant defaults (no rewrite), then the defaults of new
			// rows.
			switch {
			case asSent && c.Name == "status":
				def = " NOT NULL DEFAULT 'SENT'"
				after = append(after, "ALTER COLUMN status SET DEFAULT "+c.Default)
			case asSent && c.Name == "sent_at":
				def = " DEFAULT now()"
				after = append(after, "ALTER COLUMN sent_at DROP DEFAULT")
			}
			adds = append(adds, "ADD COLUMN "+pgx.Identifier{c.Name}.Sanitize()+" "+c.Type+def)
			res.Added[l.Name()] = append(res.Added[l.Name()], c.Name)
		}
		if len(adds) > 0 {
			if _, err := tx.Exec(ctx, "ALTER TABLE "+name+" "+strings.Join(adds, ", ")); err != nil {
				return res, lockTimeout(err, "add the poll columns", l.Name())
			}
			if len(after) > 0 {
				if _, err := tx.Exec(ctx, "ALTER TABLE "+name+" "+strings.Join(after, ", ")); err != nil {
					return res, lockTimeout(err, "set the defaults of the poll columns", l.Name())
				}
			}
		}
		agg, id := pgx.Identifier{l.Columns.AggregateID}.Sanitize(), pgx.Identifier{l.Columns.ID}.Sanitize()
		if existing > 0 && opts.ExistingRows == ExistingPending {
			res.Pending[l.Name()] = existing
			var overlap int64
			if err := tx.QueryRow(ctx, stampOverlapSQL(name, agg)).Scan(&overlap); err != nil {
				return res, fmt.Errorf("read the tied rows of %s: %w", l.Name(), err)
			}
			if overlap > 0 {
				return res, fmt.Errorf("table %s: %d groups of rows of one aggregate share a created_at and are too close to the aggregate's next row to be stamped apart by a microsecond each (their order would change): order them by hand (set created_at), or use --existing-rows sent; migrate changed nothing", l.Name(), overlap)
			}
			tag, err := tx.Exec(ctx, StampTies(name, agg, id))
			if err != nil {
				return res, lockTimeout(err, "stamp apart the tied rows", l.Name())
			}
			res.Stamped[l.Name()] = tag.RowsAffected()
		}
		// Rows that were there share the migration's time (their ids order
		// them); each new row gets the time of its insert. A volatile
		// default on ADD COLUMN would rewrite the table. A created_at that
		// was there with the transaction's time as its default gets the
		// insert's time too: else the rows of one transaction share a time
		// and go out in the order of their ids.
		redefault := false
		if _, ok := have["created_at"]; !ok {
			redefault = true
		} else {
			def, err := ColumnDefault(ctx, tx, name, "created_at")
			if err != nil {
				return res, err
			}
			if TransactionTime(def) {
				redefault = true
				res.Redefaulted[l.Name()] = def
			}
		}
		if redefault {
			if _, err := tx.Exec(ctx, "ALTER TABLE "+name+" ALTER COLUMN created_at SET DEFAULT clock_timestamp()"); err != nil {
				return res, lockTimeout(err, "set the default of created_at", l.Name())
			}
		}
		if _, ok := res.Redefaulted[l.Name()]; ok {
			// Unsent rows written under the old default: those of one
			// transaction share a time, and the claims order them by id.
			var tied int64
			if err := tx.QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM (SELECT count(*) AS n FROM `+name+`
				WHERE status <> 'SENT' GROUP BY `+agg+`, created_at HAVING count(*) > 1) s`).Scan(&tied); err != nil {
				return res, fmt.Errorf("count the tied rows of %s: %w", l.Name(), err)
			}
			if tied > 0 {
				res.Tied[l.Name()] = tied
			}
		}
		n := PollNamesOf(l)
		check := pgx.Identifier{n.StatusCheck}.Sanitize()
		statuses := "'" + strings.Join(PollStatuses, "', '") + "'"
		// A check of an earlier version lacks PARKED: it is replaced, NOT
		// VALID (a moment under the table's lock, no read of the table),
		// and validated after the commit (a read of the table that does
		// not hold its writers): the rows there satisfy the old check,
		// a subset of the new one.
		var hasParked, valid bool
		err = tx.QueryRow(ctx, `SELECT count(*) > 0, coalesce(bool_and(convalidated), false) FROM pg_constraint
			WHERE conrelid = $1::regclass AND conname = $2 AND pg_get_constraintdef(oid) LIKE '%''PARKED''%'`, name, n.StatusCheck).Scan(&hasParked, &valid)
		if err != nil {
			return res, fmt.Errorf("read the status check of %s: %w", l.Name(), err)
		}
		if !hasParked {
			if _, err := tx.Exec(ctx, "ALTER TABLE "+name+" DROP CONSTRAINT IF EXISTS "+check+", ADD CONSTRAINT "+check+" CHECK (status IN ("+statuses+")) NOT VALID"); err != nil {
				return res, lockTimeout(err, "replace the status check", l.Name())
			}
		}
		if !valid {
			validate = append(validate, [2]string{l.Name(), "ALTER TABLE " + name + " VALIDATE CONSTRAINT " + check})
		}
		// The indexes, built here on a table of at most indexRowsAtOnce
		// rows (a moment); on a larger one the build would hold the
		// writers as long as it takes, so the statements that build them
		// without blocking them are given instead (as addCreatedAt).
		// An INVALID index (a failed CREATE INDEX CONCURRENTLY) is as
		// missing: the planner does not use it. It is dropped and built
		// again here on a small table, else both statements are given.
		var missing []PollIndex
		invalid := map[string]bool{}
		for _, x := range PollIndexes(l) {
			var has, valid bool
			if err := tx.QueryRow(ctx, "SELECT count(*) > 0, coalesce(bool_and(i.indisvalid AND i.indisready), false) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass AND c.relname = $2", name, sqlquote.Cut(x.Name)).Scan(&has, &valid); err != nil {
				return res, fmt.Errorf("look up index %s: %w", x.Name, err)
			}
			if !has {
				if err := nameFree(ctx, tx, l.Schema, x.Name); err != nil {
					return res, fmt.Errorf("index of %s: %w", l.Name(), err)
				}
			}
			if !has || !valid {
				missing = append(missing, x)
				invalid[x.Name] = has
			}
		}
		var rowsThere int64
		if len(missing) > 0 {
			if err := tx.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM (SELECT FROM %s LIMIT %d) s", name, indexRowsAtOnce+1)).Scan(&rowsThere); err != nil {
				return res, fmt.Errorf("count the rows of %s: %w", l.Name(), err)
			}
		}
		var stmts []string
		for _, x := range missing {
			if rowsThere > indexRowsAtOnce {
				stmt := x.Concurrently()
				if invalid[x.Name] {
					stmt = x.Rebuild()
				}
				res.Unbuilt[l.Name()] = append(res.Unbuilt[l.Name()], stmt)
				continue
			}
			if invalid[x.Name] {
				stmts = append(stmts, "DROP INDEX "+x.schemaName())
			}
			stmts = append(stmts, x.Create)
		}
		stmts = append(stmts,
			"CREATE OR REPLACE FUNCTION "+pgx.Identifier{l.Schema, n.Function}.Sanitize()+"() RETURNS trigger LANGUAGE plpgsql AS "+sqlquote.Dollar(`
BEGIN
    PERFORM pg_notify(`+quoteLiteral(NotifyChannel)+`, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    RETURN NULL;
END `),
			"CREATE OR REPLACE TRIGGER "+pgx.Identifier{n.Trigger}.Sanitize()+" AFTER INSERT ON "+name+" FOR EACH STATEMENT EXECUTE FUNCTION "+pgx.Identifier{l.Schema, n.Function}.Sanitize()+"()",
		)
		if i == 0 {
			// walrelay_emit may write a WAL message, which the poll source
			// never reads: it inserts a row instead.
			stmts = append(stmts, createEmit(l.Schema, EmitInsertSource(l)))
		}
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return res, lockTimeout(err, "poll migration", l.Name())
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("commit migrations: %w", err)
	}
	// The status checks replaced NOT VALID: validated each in a statement
	// of its own (SHARE UPDATE EXCLUSIVE: the writers go on while it reads
	// the table), its wait for the lock bounded too. A check left not
	// valid is enforced on every write all the same; a re-run validates it.
	for _, v := range validate {
		if _, err := conn.Exec(ctx, fmt.Sprintf("SET lock_timeout = %d", createdAtLockWait.Milliseconds())); err != nil {
			return res, fmt.Errorf("validate the status check: %w", err)
		}
		_, err := conn.Exec(ctx, v[1])
		if _, rerr := conn.Exec(ctx, "RESET lock_timeout"); err == nil && rerr != nil {
			err = rerr
		}
		if err != nil {
			return res, lockTimeout(err, "validate the status check (it is enforced on every write already; run walrelay migrate --poll again to validate it)", v[0])
		}
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
