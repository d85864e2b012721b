package recovery

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/migrations"
)

// ErrNoTime refuses a time window on a table that cannot place its rows in
// time.
var ErrNoTime = errors.New("time windows need a created_at column (walrelay migrate adds it), outbox.timestamp_column or UUIDv7 ids")

// TimeColumn is the column the time windows read (the timestamp column,
// else created_at), or "" when they read the time of UUIDv7 ids.
func (t *Table) TimeColumn() string { return t.timeColumn }

// Timed reports whether the table can place its rows in time: time
// windows (--since, --until, --older-than) are then possible. A table
// with neither a time column nor only UUIDv7 ids is not.
func (t *Table) Timed(ctx context.Context) (bool, error) {
	if t.timeColumn != "" {
		return true, nil
	}
	v7, _, err := t.uuidV7(ctx)
	return v7, err
}

// checkUUIDv7 refuses a table whose ids are not all UUIDv7: the time of
// one that is not (a random UUIDv4) is not its row's, and a window by id
// would take or leave such a row whatever its age.
func (t *Table) checkUUIDv7(ctx context.Context) error {
	noColumn, fix := "the table has no created_at", "run walrelay migrate (it adds created_at, the time of each insert; rows already there are of unknown time, older than any window, but UUIDv7 ids), set outbox.timestamp_column, or use --ids FILE or --all"
	if t.createdAtType != "" {
		noColumn = "its created_at is " + t.createdAtType + ", not timestamptz"
		fix = "set outbox.timestamp_column: created_at if it holds each row's time (without a zone, UTC), or use --ids FILE or --all"
	}
	if !t.idIsUUID {
		return fmt.Errorf("%w: the id column %s of %s is not uuid and %s; %s", ErrNoTime, t.layout.Columns.ID, t.Name(), noColumn, fix)
	}
	v7, sample, err := t.uuidV7(ctx)
	if err != nil {
		return err
	}
	if !v7 {
		return fmt.Errorf("%w: the ids of %s are not all UUIDv7 (%s is not) and %s; %s", ErrNoTime, t.Name(), sample, noColumn, fix)
	}
	return nil
}

// v7Pattern matches the text of a UUIDv7 (version 7, RFC 9562 variant).
const v7Pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"

// uuidV7 tells whether every id of the table is a UUIDv7 (an empty
// table's are), reading the whole table once, and returns an id that is
// not.
func (t *Table) uuidV7(ctx context.Context) (bool, string, error) {
	if !t.idIsUUID {
		return false, "", nil
	}
	if t.v7 != nil {
		return *t.v7, t.v7Sample, nil
	}
	var sample string
	err := t.conn.QueryRow(ctx, "SELECT "+pgx.Identifier{t.layout.Columns.ID}.Sanitize()+"::text FROM "+t.name+
		" WHERE "+pgx.Identifier{t.layout.Columns.ID}.Sanitize()+"::text !~ '"+v7Pattern+"' LIMIT 1").Scan(&sample)
	v7 := errors.Is(err, pgx.ErrNoRows)
	if err != nil && !v7 {
		return false, "", fmt.Errorf("read the ids of %s: %w", t.Name(), err)
	}
	t.v7, t.v7Sample = &v7, sample
	return v7, sample, nil
}

// isV7 tells whether id is the text of a UUIDv7.
func isV7(id string) bool { return v7Regexp.MatchString(id) }

var v7Regexp = regexp.MustCompile(v7Pattern)

// Undated tells whether the table holds rows of unknown time that no
// window with a start selects: rows that were in it when walrelay migrate
// added created_at (migrations.CreatedAtUnknown) and whose ids are not
// UUIDv7. Such rows are reached by --all or --ids FILE only. It reads the
// created_at index's rows of that time.
func (t *Table) Undated(ctx context.Context) (bool, error) {
	if !t.unknownTimes {
		return false, nil
	}
	cond := migrations.UnknownTimeSQL(pgx.Identifier{t.timeColumn}.Sanitize())
	if t.idIsUUID {
		cond += " AND " + pgx.Identifier{t.layout.Columns.ID}.Sanitize() + "::text !~ '" + v7Pattern + "'"
	}
	var found bool
	if err := t.conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+t.name+" WHERE "+cond+")").Scan(&found); err != nil {
		return false, fmt.Errorf("read %s: %w", t.Name(), err)
	}
	return found, nil
}

// uuidAt is the smallest UUIDv7 of time tm: ids at or after it are of tm
// or later.
func uuidAt(tm time.Time) string {
	ms := tm.UnixMilli()
	return fmt.Sprintf("%08x-%04x-7000-8000-000000000000", uint64(ms)>>16, uint64(ms)&0xffff)
}
