package migrations

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/sqlquote"
)

// EmitFunction is the helper function through which an application writes
// an event without knowing the outbox's columns, in the first outbox
// table's schema, with the argument types EmitArgTypes:
//
//	SELECT walrelay_emit(id, aggregatetype, aggregateid, type, payload)
//
// With the message source off (decoder.Config.Messages, the default) it
// inserts a row into the first outbox table; with it on, it emits a
// transactional logical decoding message under the configured prefix
// (walrelay publishes it like a row once the transaction commits, and no
// row is left to prune). Either way it is SECURITY INVOKER: the caller
// needs INSERT on the table, or EXECUTE on pg_logical_emit_message, which
// with the message source on only the table's writers may have
// (SecureMessages).
const EmitFunction = "walrelay_emit"

// EmitArgTypes are EmitFunction's argument types, as oidvectortypes shows
// them.
const EmitArgTypes = "uuid, text, text, text, jsonb"

// emitSignature is EmitFunction's parameter list.
const emitSignature = "(\n    p_id uuid, p_aggregatetype text, p_aggregateid text, p_type text, p_payload jsonb)"

// EmitMessageSource is the body (pg_proc.prosrc) of the EmitFunction that
// emits a logical decoding message under prefix.
func EmitMessageSource(prefix string) string {
	return `
    SELECT pg_logical_emit_message(true, ` + quoteLiteral(prefix) + `, json_build_object(
        'id', p_id, 'aggregatetype', p_aggregatetype, 'aggregateid', p_aggregateid,
        'type', p_type, 'payload', p_payload)::text)
`
}

// EmitInsertSource is the body (pg_proc.prosrc) of the EmitFunction that
// inserts a row into the outbox table l.
func EmitInsertSource(l decoder.Layout) string {
	l = l.WithDefaults()
	c := l.Columns
	cols := []string{pgx.Identifier{c.ID}.Sanitize(), pgx.Identifier{c.AggregateType}.Sanitize(), pgx.Identifier{c.AggregateID}.Sanitize(),
		pgx.Identifier{c.Type}.Sanitize(), pgx.Identifier{c.Payload}.Sanitize()}
	return `
    INSERT INTO ` + pgx.Identifier{l.Schema, l.Table}.Sanitize() + ` (` + strings.Join(cols, ", ") + `)
    VALUES (p_id, p_aggregatetype, p_aggregateid, p_type, p_payload);
    SELECT pg_current_wal_insert_lsn();
`
}

// createEmit is the statement that creates or replaces EmitFunction in
// schema with body src, dollar-quoted with a tag src does not hold.
// CREATE OR REPLACE keeps the function's owner and grants, and resets
// SECURITY DEFINER.
func createEmit(schema, src string) string {
	return "CREATE OR REPLACE FUNCTION " + pgx.Identifier{schema, EmitFunction}.Sanitize() + emitSignature +
		"\nRETURNS pg_lsn LANGUAGE sql SECURITY INVOKER AS " + sqlquote.Dollar(src)
}

// EmitMessageFunctions are the signatures of pg_logical_emit_message on
// the server, as GRANT and REVOKE name them
// (pg_catalog.pg_logical_emit_message(boolean, text, text), …: PostgreSQL
// 15 has two, 17 adds a flush argument to each), with their oids.
func EmitMessageFunctions(ctx context.Context, conn *pgx.Conn) (sigs []string, oids []uint32, err error) {
	rows, err := conn.Query(ctx, `SELECT 'pg_catalog.pg_logical_emit_message(' || oidvectortypes(proargtypes) || ')', oid FROM pg_proc
		WHERE proname = 'pg_logical_emit_message' AND pronamespace = 'pg_catalog'::regnamespace ORDER BY oid`)
	if err != nil {
		return nil, nil, fmt.Errorf("look up pg_logical_emit_message: %w", err)
	}
	var sig string
	var oid uint32
	_, err = pgx.ForEachRow(rows, []any{&sig, &oid}, func() error {
		sigs, oids = append(sigs, sig), append(oids, oid)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("look up pg_logical_emit_message: %w", err)
	}
	return sigs, oids, nil
}

// EmitMessageGrant is the signature of pg_logical_emit_message among sigs
// (EmitMessageFunctions') that EmitFunction calls, the one the writers are
// granted: (boolean, text, text), or from PostgreSQL 17 (boolean, text,
// text, boolean), whose flush argument has a default.
func EmitMessageGrant(sigs []string) string {
	for _, s := range sigs {
		if strings.HasPrefix(s, "pg_catalog.pg_logical_emit_message(boolean, text, text") {
			return s
		}
	}
	return "pg_catalog.pg_logical_emit_message(boolean, text, text)"
}

// OutboxWriters lists the roles granted INSERT on the outbox table l (by
// name, quoted where they must be; PUBLIC and superusers, who need no
// grant, left out): the roles SecureMessages grants EXECUTE on
// pg_logical_emit_message.
func OutboxWriters(ctx context.Context, conn *pgx.Conn, l decoder.Layout) ([]string, error) {
	l = l.WithDefaults()
	rows, err := conn.Query(ctx, `SELECT DISTINCT a.grantee::regrole::text FROM pg_class c,
		aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
		WHERE c.oid = to_regclass($1) AND a.privilege_type = 'INSERT' AND a.grantee <> 0
		AND NOT (SELECT rolsuper FROM pg_roles WHERE oid = a.grantee) ORDER BY 1`, pgx.Identifier{l.Schema, l.Table}.Sanitize())
	if err == nil {
		var roles []string
		roles, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err == nil {
			return roles, nil
		}
	}
	return nil, fmt.Errorf("read the roles that may insert into %s: %w", l.Name(), err)
}

// SecureMessages gives the privileges the message source needs: EXECUTE on
// every signature of pg_logical_emit_message revoked from PUBLIC, and
// granted (the signature of EmitMessageGrant) to the roles with INSERT on the first outbox
// table of o, so that only they can write an event as a message. It returns
// the statements it ran. Only a superuser (the functions' owner) can
// change them: for another role PostgreSQL warns and changes nothing, which
// the caller sees by checking afterwards (relay.CheckMessagePrivileges).
func SecureMessages(ctx context.Context, conn *pgx.Conn, o decoder.Config) ([]string, error) {
	o = o.WithDefaults()
	sigs, _, err := EmitMessageFunctions(ctx, conn)
	if err != nil {
		return nil, err
	}
	writers, err := OutboxWriters(ctx, conn, o.Layout)
	if err != nil {
		return nil, err
	}
	var stmts []string
	for _, sig := range sigs {
		stmts = append(stmts, "REVOKE EXECUTE ON FUNCTION "+sig+" FROM PUBLIC")
	}
	if len(writers) > 0 {
		stmts = append(stmts, "GRANT EXECUTE ON FUNCTION "+EmitMessageGrant(sigs)+" TO "+strings.Join(writers, ", "))
	}
	tx, err := begin(ctx, conn)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return nil, fmt.Errorf("%s: %w", s, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit the privileges of pg_logical_emit_message: %w", err)
	}
	return stmts, nil
}

// horizonComment is the comment on EmitFunction in which
// RecordMessageHorizon records the horizon; horizonPattern reads it back.
const horizonComment = "walrelay: messages are trusted from transaction %d (walrelay migrate recorded it once only the outbox's writers could execute pg_logical_emit_message)"

var horizonPattern = regexp.MustCompile(`^walrelay: messages are trusted from transaction ([0-9]+) `)

// emitName is EmitFunction of the first outbox table of o with its
// argument types, as COMMENT ON FUNCTION names it.
func emitName(o decoder.Config) string {
	o = o.WithDefaults()
	return pgx.Identifier{o.Schema, EmitFunction}.Sanitize() + "(" + EmitArgTypes + ")"
}

// MessageHorizon reads the horizon RecordMessageHorizon recorded for the
// outbox o: the full transaction id from which logical decoding messages
// may be trusted as events (decoder.Config.MessagesFrom). ok is false when
// none is recorded (walrelay migrate has not secured the message source,
// or EmitFunction was dropped and created again).
func MessageHorizon(ctx context.Context, conn *pgx.Conn, o decoder.Config) (xid uint64, ok bool, err error) {
	var c *string
	if err := conn.QueryRow(ctx, `SELECT obj_description(to_regprocedure($1), 'pg_proc')`, emitName(o)).Scan(&c); err != nil {
		return 0, false, fmt.Errorf("read the comment on %s: %w", emitName(o), err)
	}
	if c == nil {
		return 0, false, nil
	}
	m := horizonPattern.FindStringSubmatch(*c)
	if m == nil {
		return 0, false, nil
	}
	xid, err = strconv.ParseUint(m[1], 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("read the horizon on %s: %w", emitName(o), err)
	}
	return xid, true, nil
}

// RecordMessageHorizon records, as the comment on EmitFunction (which only
// its owner or a superuser may change), the full id of a transaction it
// begins now, after the privileges of pg_logical_emit_message were
// secured (SecureMessages, committed): any transaction that emitted a
// message before that had its id assigned before, so it is older, and
// every later transaction is at or above it. A statement already running
// when the privileges changed had its EXECUTE checked as it started, and
// may emit (and get its id) later: it first waits for every statement of
// this database that began before now to end (pg_stat_activity; a
// superuser sees them all), or for ctx. It returns the id.
func RecordMessageHorizon(ctx context.Context, conn *pgx.Conn, o decoder.Config) (uint64, error) {
	if err := waitForStatementsBefore(ctx, conn); err != nil {
		return 0, err
	}
	tx, err := begin(ctx, conn)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	var s string
	if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text").Scan(&s); err != nil {
		return 0, fmt.Errorf("read the transaction id: %w", err)
	}
	xid, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read the transaction id %q: %w", s, err)
	}
	if _, err := tx.Exec(ctx, "COMMENT ON FUNCTION "+emitName(o)+" IS "+quoteLiteral(fmt.Sprintf(horizonComment, xid))); err != nil {
		return 0, fmt.Errorf("record the horizon of the message source on %s: %w", emitName(o), err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("record the horizon of the message source on %s: %w", emitName(o), err)
	}
	return xid, nil
}

// waitForStatementsBefore waits until no client session of this database
// but conn's runs a statement that began before it was called.
func waitForStatementsBefore(ctx context.Context, conn *pgx.Conn) error {
	var since time.Time
	if err := conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&since); err != nil {
		return fmt.Errorf("read the time: %w", err)
	}
	for {
		var pids []int32
		err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(pid ORDER BY pid), '{}') FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()
			AND state = 'active' AND query_start < $1`, since).Scan(&pids)
		if err != nil {
			return fmt.Errorf("wait for the statements begun before the privileges of pg_logical_emit_message changed: %w", err)
		}
		if len(pids) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the statements of sessions %v began before the privileges of pg_logical_emit_message changed and still run, and may emit messages as before: end them (pg_cancel_backend) and run walrelay migrate again: %w", pids, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
