// Package migrations holds walrelay's SQL: the outbox table in Debezium's
// layout (or the configured column names: decoder.Config, the one
// definition of the layout) and the walrelay_emit helper function (emitting
// under the configured message prefix), embedded in the binary and applied
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
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
)

//go:embed *.sql
var files embed.FS

//go:embed inbox/*.sql
var inboxFiles embed.FS

// lockKey is the pg_advisory_xact_lock key that serializes migrations
// ("walrelay" in ASCII).
const lockKey = 0x77616c72656c6179

// EmitFunctionSQL is the SQL of walrelay_emit's call to
// pg_logical_emit_message for a prefix: a function whose source lacks it
// emits under another prefix.
func EmitFunctionSQL(prefix string) string {
	return "pg_logical_emit_message(true, " + quoteLiteral(prefix) + ","
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Result says what Apply found and did.
type Result struct {
	Created []string // the outbox tables created, schema.table; tables that existed are left as they are
}

// tableMigration is the migration that creates an outbox table: applied for
// each table of several, the others once, in the first table's schema.
const tableMigration = "0001_outbox.sql"

// Apply creates each outbox table of o, the layout the decoder reads (if
// missing; an existing table is left as it is), and the helper function in
// the first table's schema emitting under o's message prefix, in one
// transaction. Empty fields of o take the decoder's defaults.
func Apply(ctx context.Context, conn *pgx.Conn, o decoder.Config) (Result, error) {
	o = o.WithDefaults()
	var res Result
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
		for _, x := range []struct{ name, typ string }{{l.PartitionColumn, "integer"}, {l.TimestampColumn, "timestamptz"}, {l.TraceColumn, "text"}} {
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
		if !exists {
			res.Created = append(res.Created, l.Name())
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("commit migrations: %w", err)
	}
	return res, nil
}

// begin starts a migration's transaction and takes the migrations' lock
// in it; the caller rolls it back unless it commits.
func begin(ctx context.Context, conn *pgx.Conn) (pgx.Tx, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin migration: %w", err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(lockKey)); err != nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("take migration lock: %w", err)
	}
	return tx, nil
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

// InboxClaimFunction is the name of the claim function of the inbox table
// named table: <table>_claim, in the table's schema.
func InboxClaimFunction(schema, table string) string {
	return pgx.Identifier{schema, table + "_claim"}.Sanitize()
}

// ApplyInbox creates the inbox table schema.table (if missing) and its
// claim function (InboxClaimFunction), in one transaction. It needs
// nothing of the outbox: it runs in the consumer's database.
func ApplyInbox(ctx context.Context, conn *pgx.Conn, schema, table string) error {
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
	r := strings.NewReplacer("{{table}}", pgx.Identifier{schema, table}.Sanitize(),
		"{{index}}", pgx.Identifier{table + "_processed_at"}.Sanitize(),
		"{{claim}}", InboxClaimFunction(schema, table))
	if err := run(ctx, tx, inboxFiles, names, r); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit inbox migrations: %w", err)
	}
	return nil
}
