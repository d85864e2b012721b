// Package migrations holds walrelay's SQL: the outbox table in Debezium's
// layout and the walrelay_emit helper function, embedded in the binary and
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

// Result says what Apply found and did.
type Result struct {
	TableCreated bool // false: the table existed
}

// Apply creates the outbox table schema.table (if missing) and the helper
// function in schema, in one transaction.
func Apply(ctx context.Context, conn *pgx.Conn, schema, table string) (Result, error) {
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
	r := strings.NewReplacer("{{table}}", pgx.Identifier{schema, table}.Sanitize(), "{{schema}}", pgx.Identifier{schema}.Sanitize())
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
