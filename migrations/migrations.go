// Package migrations holds walrelay's SQL: the outbox table in Debezium's
// layout (or the configured column names: decoder.Config, the one
// definition of the layout) and the walrelay_emit helper function
// (EmitFunction: inserting a row, or emitting a message under the
// configured prefix), embedded in the binary and applied
// by Apply, which `walrelay migrate` calls; and the inbox table of package
// inbox with its claim function, applied by ApplyInbox (`walrelay migrate
// --inbox`, inbox.Migrate) in the consumer's database. The publication and
// the slot are created by the replication package, after these.
//
// Every file is idempotent (CREATE … IF NOT EXISTS, CREATE OR REPLACE) and
// all of them run in one transaction under an advisory lock, so concurrent
// runs and re-runs are safe.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/sqlquote"
)

//go:embed *.sql
var files embed.FS

//go:embed inbox/*.sql
var inboxFiles embed.FS

// lockKey is the pg_advisory_xact_lock key that serializes migrations
// ("walrelay" in ASCII).
const lockKey = 0x77616c72656c6179

// quoteLiteral quotes s as a string literal that reads the same whatever
// the session's standard_conforming_strings (walrelay_emit's body is
// parsed in its caller's session).
func quoteLiteral(s string) string { return sqlquote.Literal(s) }

// Result says what Apply found and did.
type Result struct {
	Created []string // the outbox tables created, schema.table; tables that existed are left as they are (but for CreatedAt)
	// CreatedAt holds the tables, schema.table, that were given the
	// column CreatedAt by this run: the rows a table that existed held
	// take CreatedAtUnknown.
	CreatedAt []string
	// CreatedAtIndex holds, for a table of CreatedAt too large to index
	// in the migration (the build would hold its writers), the statement
	// that indexes created_at without blocking them, to run by hand.
	CreatedAtIndex map[string]string
	// EmitNotCreated is why EmitFunction was left as it was (nil: it was
	// created or replaced): the first outbox table, which existed, lacks
	// a configured column that its body names (the server's error). The
	// caller names the column (relay.CheckTable) or reports this.
	EmitNotCreated error
}

// CreatedAt is the column Apply gives every outbox table that lacks it: a
// timestamptz, NOT NULL, defaulting to clock_timestamp(), the time of each
// row's insert. The time windows of replay, reconcile and prune use it
// (without outbox.timestamp_column), whatever the ids; the poll source
// orders by it. A table that existed gets it without a rewrite: its rows
// take CreatedAtUnknown.
const CreatedAt = "created_at"

// CreatedAtUnknown is the created_at of the rows a table held when Apply
// gave it CreatedAt: their time is not known, and a constant default is
// stored once in the catalog instead of rewriting the table. The time
// windows take such a row as older than any window (a window with a start
// never holds it, one with only an end does), but a row whose id is a
// UUIDv7, which they place by its id's time. Not -infinity: the poll
// source computes extract(epoch ...)::int8 of created_at.
const CreatedAtUnknown = "1970-01-01 00:00:00+00"

// CreatedAtUnknownTime is CreatedAtUnknown as a time.
var CreatedAtUnknownTime = time.Unix(0, 0).UTC()

// CreatedAtUnknownSpan is the span from CreatedAtUnknown of the created_at
// of rows of unknown time: ApplyPollWith (ExistingPending) stamps apart
// the rows of one aggregate at CreatedAtUnknown by a microsecond each.
const CreatedAtUnknownSpan = 24 * time.Hour

// UnknownTime reports whether t, a created_at, marks a row of unknown
// time (within CreatedAtUnknownSpan of CreatedAtUnknown).
func UnknownTime(t time.Time) bool {
	return !t.Before(CreatedAtUnknownTime) && t.Before(CreatedAtUnknownTime.Add(CreatedAtUnknownSpan))
}

// UnknownTimeSQL is the condition that col (quoted), a created_at, marks a
// row of unknown time (UnknownTime): a range of its index.
func UnknownTimeSQL(col string) string {
	return "(" + col + " >= " + quoteLiteral(CreatedAtUnknown) + "::timestamptz AND " + col + " < " + quoteLiteral(CreatedAtUnknown) + "::timestamptz + interval '1 day')"
}

// tableMigration is the migration that creates an outbox table: applied for
// each table of several, the others once, in the first table's schema.
const tableMigration = "0001_outbox.sql"

// Apply creates each outbox table of o, the layout the decoder reads (if
// missing; an existing table is left as it is), and the helper function
// EmitFunction in the first table's schema (inserting into that table, or
// with o.Messages emitting under o's message prefix), in one transaction.
// Empty fields of o take the decoder's defaults. The privileges of the
// message source are SecureMessages'.
func Apply(ctx context.Context, conn *pgx.Conn, o decoder.Config) (Result, error) {
	o = o.WithDefaults()
	var res Result
	if err := checkNames(o); err != nil {
		return res, err
	}
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return res, fmt.Errorf("list migrations: %w", err)
	}
	sort.Strings(names)
	tx, err := begin(ctx, conn)
	if err != nil {
		return res, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	for i, l := range o.Layouts() {
		schema, table, c := l.Schema, l.Table, l.Columns
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{schema, table}.Sanitize()).Scan(&exists); err != nil {
			return res, fmt.Errorf("look up table %s.%s: %w", schema, table, err)
		}
		var headers strings.Builder
		for _, h := range l.HeaderColumns {
			headers.WriteString(",\n    " + pgx.Identifier{h}.Sanitize() + " text")
		}
		for _, x := range []struct{ name, typ string }{{l.PartitionColumn, "integer"}, {l.TimestampColumn, "timestamptz"}, {l.OrderColumn, "bigint GENERATED BY DEFAULT AS IDENTITY"}, {l.TraceColumn, "text"}, {l.VersionColumn, "bigint"}} {
			if x.name != "" && !slices.Contains(l.HeaderColumns, x.name) {
				headers.WriteString(",\n    " + pgx.Identifier{x.name}.Sanitize() + " " + x.typ)
			}
		}
		r := strings.NewReplacer("{{table}}", pgx.Identifier{schema, table}.Sanitize(), "{{schema}}", pgx.Identifier{schema}.Sanitize(),
			"{{id}}", pgx.Identifier{c.ID}.Sanitize(), "{{aggregatetype}}", pgx.Identifier{c.AggregateType}.Sanitize(),
			"{{aggregateid}}", pgx.Identifier{c.AggregateID}.Sanitize(), "{{type}}", pgx.Identifier{c.Type}.Sanitize(),
			"{{payload}}", pgx.Identifier{c.Payload}.Sanitize(), "{{header_columns}}", headers.String(), "{{prefix}}", quoteLiteral(o.MessagePrefix))
		apply := names
		if i > 0 {
			apply = []string{tableMigration}
		}
		if err := run(ctx, tx, files, apply, r); err != nil {
			return res, err
		}
		added, index, err := addCreatedAt(ctx, tx, l, !exists)
		if err != nil {
			return res, err
		}
		if added {
			res.CreatedAt = append(res.CreatedAt, l.Name())
		}
		if index != "" {
			if res.CreatedAtIndex == nil {
				res.CreatedAtIndex = map[string]string{}
			}
			res.CreatedAtIndex[l.Name()] = index
		}
		if i == 0 {
			src := EmitInsertSource(l)
			if o.Messages {
				src = EmitMessageSource(o.MessagePrefix)
			}
			if res.EmitNotCreated, err = createEmitChecked(ctx, tx, schema, src); err != nil {
				return res, err
			}
		}
		if !exists {
			res.Created = append(res.Created, l.Name())
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("commit migrations: %w", err)
	}
	return res, nil
}

// createdAtLockWait bounds how long addCreatedAt waits for the table's lock.
var createdAtLockWait = 10 * time.Second

// addCreatedAt gives the table of l the column CreatedAt if it has no
// column of that name (one of another type is left as it is, and the
// windows do not use it), and an index on it, and says whether it added
// the column, and the statement to index it when it did not. Added with
// the constant CreatedAtUnknown as its default, which PostgreSQL stores
// once in the catalog instead of rewriting the table (a volatile default
// would rewrite it), so the rows there take it; then defaulting to each
// insert's time. fresh says that the table was created by this migration.
func addCreatedAt(ctx context.Context, tx pgx.Tx, l decoder.Layout, fresh bool) (added bool, index string, err error) {
	name := pgx.Identifier{l.Schema, l.Table}.Sanitize()
	var has bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)`, name, CreatedAt).Scan(&has); err != nil {
		return false, "", fmt.Errorf("look up %s.%s: %w", l.Name(), CreatedAt, err)
	}
	if has {
		return false, "", nil
	}
	// The index is named after the table: for a table created now, a
	// name PostgreSQL keeps whole; for one that existed, any name no
	// other relation holds (cut or not: a table of a long name keeps
	// working).
	if fresh {
		if err := sqlquote.CheckName(l.Table, "_"+CreatedAt); err != nil {
			return false, "", fmt.Errorf("outbox table %q: %w", l.Name(), err)
		}
	}
	if err := nameFree(ctx, tx, l.Schema, l.Table+"_"+CreatedAt); err != nil {
		return false, "", fmt.Errorf("index of %s.%s: %w", l.Name(), CreatedAt, err)
	}
	col := pgx.Identifier{CreatedAt}.Sanitize()
	// The ALTER waits for the table's lock behind every transaction that
	// uses the table, and the application's writes queue behind it: it
	// waits a bounded time, and migrate fails (changing nothing) rather
	// than stall the writers.
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", createdAtLockWait.Milliseconds())); err != nil {
		return false, "", fmt.Errorf("add %s to %s: %w", CreatedAt, l.Name(), err)
	}
	if _, err := tx.Exec(ctx, "ALTER TABLE "+name+" ADD COLUMN "+col+" timestamptz NOT NULL DEFAULT "+quoteLiteral(CreatedAtUnknown)+"::timestamptz"); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55P03" {
			return false, "", fmt.Errorf("add %s to %s: the table's lock was not free within %s (a long transaction uses it); migrate changed nothing: run it again when the table is quieter", CreatedAt, l.Name(), createdAtLockWait)
		}
		return false, "", fmt.Errorf("add %s to %s: %w", CreatedAt, l.Name(), err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout TO DEFAULT"); err != nil {
		return false, "", fmt.Errorf("add %s to %s: %w", CreatedAt, l.Name(), err)
	}
	if _, err := tx.Exec(ctx, "ALTER TABLE "+name+" ALTER COLUMN "+col+" SET DEFAULT clock_timestamp()"); err != nil {
		return false, "", fmt.Errorf("set the default of %s.%s: %w", l.Name(), CreatedAt, err)
	}
	// The windows' index, built here on a table of at most indexRowsAtOnce
	// rows (the table is locked already: a moment); on a larger one the
	// build would hold the writers as long as it takes, so the statement
	// that builds it without blocking them is given instead.
	idx := pgx.Identifier{l.Table + "_" + CreatedAt}.Sanitize()
	create := "CREATE INDEX IF NOT EXISTS " + idx + " ON " + name + " (" + col + ")"
	var n int64
	if err := tx.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM (SELECT FROM %s LIMIT %d) s", name, indexRowsAtOnce+1)).Scan(&n); err != nil {
		return false, "", fmt.Errorf("count the rows of %s: %w", l.Name(), err)
	}
	if n > indexRowsAtOnce {
		return true, strings.Replace(create, "CREATE INDEX", "CREATE INDEX CONCURRENTLY", 1), nil
	}
	if _, err := tx.Exec(ctx, create); err != nil {
		return false, "", fmt.Errorf("index %s.%s: %w", l.Name(), CreatedAt, err)
	}
	return true, "", nil
}

// indexRowsAtOnce is the most rows of a table to which addCreatedAt adds
// created_at that it indexes in the migration.
var indexRowsAtOnce int64 = 100000

// createEmitChecked creates EmitFunction in schema with body src, its
// body checked by the server. An existing outbox table may lack a
// configured column: then the function is left as it was (a savepoint
// takes the failed statement back) and the server's error is returned as
// notCreated, so that migrate goes on to name the column
// (relay.CheckTable) instead of failing on the function's body.
func createEmitChecked(ctx context.Context, tx pgx.Tx, schema, src string) (notCreated, err error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("create function %s.%s: %w", schema, EmitFunction, err)
	}
	_, err = sp.Exec(ctx, createEmit(schema, src))
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42703" { // undefined_column
		notCreated = fmt.Errorf("function %s.%s not created: %w", schema, EmitFunction, err)
		if err := sp.Rollback(ctx); err != nil {
			return nil, fmt.Errorf("create function %s.%s: %w", schema, EmitFunction, err)
		}
		return notCreated, nil
	}
	if err != nil {
		_ = sp.Rollback(ctx)
		return nil, fmt.Errorf("create function %s.%s: %w", schema, EmitFunction, err)
	}
	if err := sp.Commit(ctx); err != nil {
		return nil, fmt.Errorf("create function %s.%s: %w", schema, EmitFunction, err)
	}
	return nil, nil
}

// checkNames refuses a name of o's tables that walrelay could not write
// into SQL as it is (decoder.Layout.CheckNames). The objects a migration
// names after a table are checked where they are created: their names
// must not be cut (two tables would name one object), but a table that
// has them already, of a longer name, keeps them.
func checkNames(o decoder.Config) error {
	for _, l := range o.Layouts() {
		if err := l.CheckNames(); err != nil {
			return err
		}
	}
	return nil
}

// checkFunctionBodies is the check_function_bodies of the migrations: on.
// (A test turns it off, to show that the quoting alone keeps a name from
// ending a body.)
var checkFunctionBodies = "on"

// begin starts a migration's transaction and takes the migrations' lock
// in it; the caller rolls it back unless it commits. The server checks
// the bodies of the functions it creates (check_function_bodies), whatever
// the role or database says: a body that does not parse as written is
// refused, never created.
func begin(ctx context.Context, conn *pgx.Conn) (pgx.Tx, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin migration: %w", err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(lockKey)); err != nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("take migration lock: %w", err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL check_function_bodies = "+checkFunctionBodies); err != nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("check function bodies in the migration: %w", err)
	}
	return tx, nil
}

// bodyTag is a dollar tag ($walrelay$, or $walrelay1$, …) that none of
// the values of pairs (placeholder, value, …) holds, for the bodies of
// files in which those values are written: a value is a quoted name or
// literal, bounded by a quote, so the tag can only occur inside one.
func bodyTag(pairs []string) string {
	var values []string
	for i := 1; i < len(pairs); i += 2 {
		values = append(values, pairs[i])
	}
	all := strings.Join(values, "\x00")
	tag := "$walrelay$"
	for i := 1; strings.Contains(all, tag); i++ {
		tag = "$walrelay" + strconv.Itoa(i) + "$"
	}
	return tag
}

// run applies the migrations names of fsys in tx, with r filling their
// placeholders.
func run(ctx context.Context, tx pgx.Tx, fsys fs.FS, names []string, r *strings.Replacer) error {
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return fmt.Errorf("read migration %s: %w", name, err)
		}
		if _, err := tx.Exec(ctx, r.Replace(string(b))); err != nil {
			return fmt.Errorf("apply migration %s: %w", name, err)
		}
	}
	return nil
}

// InboxVersionsTable is the name of the versions table of the inbox table
// named table (package inbox's Config.VersionOrder): <table>_versions, in
// the table's schema.
func InboxVersionsTable(schema, table string) string {
	return pgx.Identifier{schema, table + inboxVersionsSuffix}.Sanitize()
}

// inboxVersionsMigration creates the versions table.
const inboxVersionsMigration = "inbox/0005_inbox_versions.sql"

// inboxVersionsSuffix is what the versions table adds to the inbox
// table's name.
const inboxVersionsSuffix = "_versions"

// InboxClaimFunction is the name of the claim function of the inbox table
// named table: <table>_claim, in the table's schema.
func InboxClaimFunction(schema, table string) string {
	return pgx.Identifier{schema, table + "_claim"}.Sanitize()
}

// CheckInboxTable refuses an inbox table schema.table whose names walrelay
// could not write into SQL as they are (sqlquote.CheckName).
func CheckInboxTable(schema, table string) error {
	if err := sqlquote.CheckName(schema); err != nil {
		return fmt.Errorf("inbox table's schema: %w", err)
	}
	if err := sqlquote.CheckName(table); err != nil {
		return fmt.Errorf("inbox table: %w", err)
	}
	return nil
}

// inboxSuffixes are what ApplyInbox adds to the inbox table's name for
// the objects it names after it.
var inboxSuffixes = []string{"_processed_at", "_claim", inboxVersionsSuffix}

// ApplyInbox creates the inbox table schema.table (if missing) and its
// claim functions (InboxClaimFunction), or migrates a table of an earlier
// layout (0002_inbox_topic.sql: keyed on the topic too;
// 0003_inbox_claims_serialize.sql: both claims serialize;
// 0004_inbox_claims_read_committed.sql: both refuse a transaction that is
// not READ COMMITTED; 0005_inbox_versions.sql: the versions table,
// InboxVersionsTable), in one
// transaction. It needs
// nothing of the outbox: it runs in the consumer's database.
func ApplyInbox(ctx context.Context, conn *pgx.Conn, schema, table string) error {
	if err := CheckInboxTable(schema, table); err != nil {
		return err
	}
	names, err := fs.Glob(inboxFiles, "inbox/*.sql")
	if err != nil {
		return fmt.Errorf("list inbox migrations: %w", err)
	}
	sort.Strings(names)
	tx, err := begin(ctx, conn)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{schema, table}.Sanitize()).Scan(&exists); err != nil {
		return fmt.Errorf("look up inbox table %s.%s: %w", schema, table, err)
	}
	if !exists {
		// A new inbox table: the names of its index and claim functions
		// must not be cut, or two inbox tables would share them. (One
		// created before this rule, of a longer name, keeps its own.)
		if err := sqlquote.CheckName(table, inboxSuffixes...); err != nil {
			return fmt.Errorf("inbox table: %w", err)
		}
	} else if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", InboxVersionsTable(schema, table)).Scan(&exists); err != nil {
		return fmt.Errorf("look up the versions table of inbox table %s.%s: %w", schema, table, err)
	} else if !exists && sqlquote.CheckName(table, inboxVersionsSuffix) != nil {
		// An inbox table made before the rule above, of a name that
		// <table>_versions would be cut from, migrates as before but gets
		// no versions table, which two such tables could share: its
		// consumers cannot take Config.VersionOrder (Run says so).
		names = slices.DeleteFunc(names, func(n string) bool { return n == inboxVersionsMigration })
	}
	// The bodies of the files (the claims, a DO block) hold the names: a
	// dollar tag they do not hold quotes them.
	pairs := []string{"{{table}}", pgx.Identifier{schema, table}.Sanitize(),
		"{{table_literal}}", quoteLiteral(pgx.Identifier{schema, table}.Sanitize()),
		"{{index}}", pgx.Identifier{table + "_processed_at"}.Sanitize(),
		"{{claim}}", InboxClaimFunction(schema, table),
		"{{versions}}", InboxVersionsTable(schema, table)}
	r := strings.NewReplacer(append(pairs, "{{tag}}", bodyTag(pairs))...)
	if err := run(ctx, tx, inboxFiles, names, r); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit inbox migrations: %w", err)
	}
	return nil
}
