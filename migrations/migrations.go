// Package migrations holds walrelay's SQL: the outbox table in Debezium's
// layout (or the configured column names) and the walrelay_emit helper
// function (emitting under the configured message prefix), embedded in the binary and
// applied by Apply, which `walrelay migrate` calls. The publication and the
// slot are created by the replication package, after these.
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
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed *.sql
var files embed.FS

// lockKey is the pg_advisory_xact_lock key that serializes migrations
// ("walrelay" in ASCII).
const lockKey = 0x77616c72656c6179

// Layout is the outbox table and message prefix that Apply creates. Empty
// fields take the defaults: public.outbox, Debezium's column names, prefix
// "walrelay".
type Layout struct {
	Schema, Table                                 string
	ID, AggregateType, AggregateID, Type, Payload string
	// HeaderColumns become text columns of a table Apply creates.
	HeaderColumns []string
	MessagePrefix string
}

func (l *Layout) defaults() {
	for _, f := range []struct {
		p   *string
		def string
	}{{&l.Schema, "public"}, {&l.Table, "outbox"}, {&l.ID, "id"}, {&l.AggregateType, "aggregatetype"}, {&l.AggregateID, "aggregateid"},
		{&l.Type, "type"}, {&l.Payload, "payload"}, {&l.MessagePrefix, "walrelay"}} {
		if *f.p == "" {
			*f.p = f.def
		}
	}
}

// EmitFunctionSQL is the SQL of walrelay_emit's call to
// pg_logical_emit_message for a prefix: a function whose source lacks it
// emits under another prefix.
func EmitFunctionSQL(prefix string) string {
	return "pg_logical_emit_message(true, " + quoteLiteral(prefix) + ","
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Result says what Apply found and did.
type Result struct {
	TableCreated bool // false: the table existed
}

// Apply creates the outbox table of the layout (if missing; an existing
// table is left as it is) and the helper function in its schema, in one
// transaction.
func Apply(ctx context.Context, conn *pgx.Conn, l Layout) (Result, error) {
	l.defaults()
	schema, table := l.Schema, l.Table
	var res Result
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return res, fmt.Errorf("list migrations: %w", err)
	}
	sort.Strings(names)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("begin migration: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(lockKey)); err != nil {
		return res, fmt.Errorf("take migration lock: %w", err)
	}
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{schema, table}.Sanitize()).Scan(&exists); err != nil {
		return res, fmt.Errorf("look up table %s.%s: %w", schema, table, err)
	}
	var headers strings.Builder
	for _, h := range l.HeaderColumns {
		headers.WriteString(",\n    " + pgx.Identifier{h}.Sanitize() + " text")
	}
	r := strings.NewReplacer("{{table}}", pgx.Identifier{schema, table}.Sanitize(), "{{schema}}", pgx.Identifier{schema}.Sanitize(),
		"{{id}}", pgx.Identifier{l.ID}.Sanitize(), "{{aggregatetype}}", pgx.Identifier{l.AggregateType}.Sanitize(),
		"{{aggregateid}}", pgx.Identifier{l.AggregateID}.Sanitize(), "{{type}}", pgx.Identifier{l.Type}.Sanitize(),
		"{{payload}}", pgx.Identifier{l.Payload}.Sanitize(), "{{header_columns}}", headers.String(), "{{prefix}}", quoteLiteral(l.MessagePrefix))
	for _, name := range names {
		b, err := files.ReadFile(name)
		if err != nil {
			return res, fmt.Errorf("read migration %s: %w", name, err)
		}
		if _, err := tx.Exec(ctx, r.Replace(string(b))); err != nil {
			return res, fmt.Errorf("apply migration %s: %w", name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("commit migrations: %w", err)
	}
	res.TableCreated = !exists
	return res, nil
}
