package relay

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/migrations"
)

// The trust boundary: an event reaches Kafka only if a role that may insert
// into the outbox table wrote it. For rows PostgreSQL's INSERT privilege
// sees to it. For logical decoding messages, which any role may emit by
// default, the message source is off unless configured
// (decoder.Config.Messages), and on only where the privileges of
// pg_logical_emit_message match the table's (CheckMessagePrivileges).

// nonWriters says who may execute the function fn without INSERT on the
// outbox table l: PUBLIC (every role), or else the roles that may (through
// a grant to them or to a role they inherit from; a superuser may insert).
func nonWriters(ctx context.Context, conn *pgx.Conn, fn uint32, l decoder.Layout) (public bool, roles []string, err error) {
	err = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
		WHERE p.oid = $1 AND a.grantee = 0 AND a.privilege_type = 'EXECUTE')`, fn).Scan(&public)
	if err != nil || public {
		return public, nil, err
	}
	rows, err := conn.Query(ctx, `SELECT r.oid::regrole::text FROM pg_roles r
		WHERE has_function_privilege(r.oid, $1::oid, 'EXECUTE') AND NOT has_table_privilege(r.oid, to_regclass($2), 'INSERT') ORDER BY 1`,
		fn, pgx.Identifier{l.Schema, l.Table}.Sanitize())
	if err == nil {
		roles, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	return false, roles, err
}

// CheckMessagePrivileges refuses the message source (o.Messages) while a
// role that may not insert into the first outbox table of o may execute
// pg_logical_emit_message (any of its signatures; PUBLIC may, unless
// revoked) or a SECURITY DEFINER function that calls it, naming the REVOKE
// and the GRANT to run: such a role could publish events it may not write.
// A superuser may do both. With the message source off it checks nothing:
// messages are no events then.
func CheckMessagePrivileges(ctx context.Context, conn *pgx.Conn, o decoder.Config) error {
	if !o.Messages {
		return nil
	}
	o = o.WithDefaults()
	table := sqlName(o.Schema) + "." + sqlName(o.Table)
	sigs, oids, err := migrations.EmitMessageFunctions(ctx, conn)
	if err != nil {
		return err
	}
	var revokePublic, problems []string
	for i, sig := range sigs {
		public, roles, err := nonWriters(ctx, conn, oids[i], o.Layout)
		if err != nil {
			return fmt.Errorf("read the privileges of %s: %w", sig, err)
		}
		if public {
			revokePublic = append(revokePublic, "REVOKE EXECUTE ON FUNCTION "+sig+" FROM PUBLIC")
		}
		for _, r := range roles {
			problems = append(problems, fmt.Sprintf("role %s may execute %s without INSERT on %s: REVOKE EXECUTE ON FUNCTION %s FROM %s (or from the role it inherits it from), or GRANT INSERT ON %s TO %s if it writes events",
				r, sig, table, sig, r, table, r))
		}
	}
	if len(revokePublic) > 0 {
		writers, err := migrations.OutboxWriters(ctx, conn, o.Layout)
		if err != nil {
			return err
		}
		to := "<each role that writes events with walrelay_emit; it needs INSERT on " + table + " too>"
		if len(writers) > 0 {
			to = strings.Join(writers, ", ")
		}
		return fmt.Errorf("outbox.messages is on, but every role may execute pg_logical_emit_message (PostgreSQL grants it to PUBLIC), so a role without INSERT on %s could publish events: "+
			"as a superuser run %s; then GRANT EXECUTE ON FUNCTION %s TO %s (walrelay migrate does both); or turn outbox.messages off and write events as rows",
			table, strings.Join(revokePublic, "; "), migrations.EmitMessageGrant(sigs), to)
	}
	// A SECURITY DEFINER function that emits messages lends its owner's
	// EXECUTE to whoever may call it. Its body is read as written
	// (prosrc), or as PostgreSQL parsed it for an SQL-standard body (BEGIN
	// ATOMIC, whose prosrc is empty). A body that builds the call as
	// dynamic SQL, or a function in C, is not seen: docs/security.md.
	rows, err := conn.Query(ctx, `SELECT p.oid, p.oid::regprocedure::text FROM pg_proc p
		WHERE p.prosecdef AND p.pronamespace <> 'pg_catalog'::regnamespace
		AND (p.prosrc ILIKE '%pg_logical_emit_message%' OR (p.prosqlbody IS NOT NULL AND pg_get_function_sqlbody(p.oid) ILIKE '%pg_logical_emit_message%'))
		ORDER BY 2`)
	if err != nil {
		return fmt.Errorf("look up SECURITY DEFINER functions: %w", err)
	}
	type fn struct {
		oid  uint32
		name string
	}
	var fns []fn
	var f fn
	if _, err := pgx.ForEachRow(rows, []any{&f.oid, &f.name}, func() error { fns = append(fns, f); return nil }); err != nil {
		return fmt.Errorf("look up SECURITY DEFINER functions: %w", err)
	}
	for _, f := range fns {
		public, roles, err := nonWriters(ctx, conn, f.oid, o.Layout)
		if err != nil {
			return fmt.Errorf("read the privileges of %s: %w", f.name, err)
		}
		if public {
			roles = []string{"PUBLIC"}
		}
		for _, r := range roles {
			problems = append(problems, fmt.Sprintf("%s may execute %s, a SECURITY DEFINER function that calls pg_logical_emit_message, without INSERT on %s: REVOKE EXECUTE ON FUNCTION %s FROM %s",
				r, f.name, table, f.name, r))
		}
	}
	if len(problems) > 0 {
		return errors.New("outbox.messages is on, but " + strings.Join(problems, "; "))
	}
	return nil
}

// sqlName is an identifier as a statement an error suggests writes it:
// quoted only where it must be.
func sqlName(s string) string {
	if plainName.MatchString(s) {
		return s
	}
	return pgx.Identifier{s}.Sanitize()
}

var plainName = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// CheckEmitFunction refuses every function named walrelay_emit that an
// application's call may resolve to and that is not the one walrelay
// migrate writes for o, in the first outbox table's schema: one that emits
// under a prefix walrelay does not read, or emits a message while the
// message source is off, or emits in any other way, would let its events
// pass unpublished. One in the outbox's schema that inserts rows (into
// this outbox or another walrelay's) is accepted: rows are durable. It reads every overload in the outbox's schema, and
// every walrelay_emit in a schema that may come first on a writer's
// search_path (searchPathSchemas); one in a schema on no writer's path is
// left alone, so that a role that may create one there cannot keep
// walrelay from starting. Only overloads that a call with five arguments
// may resolve to count: five parameters, or more with defaults for the
// rest, or a VARIADIC one; another cannot take an application's call. A SECURITY DEFINER walrelay_emit is refused
// while a role that may not insert into the outbox may execute it.
func CheckEmitFunction(ctx context.Context, conn *pgx.Conn, o decoder.Config) error {
	o = o.WithDefaults()
	schemas, err := searchPathSchemas(ctx, conn, o.Layout)
	if err != nil {
		return err
	}
	rows, err := conn.Query(ctx, `SELECT p.oid, n.nspname::text, oidvectortypes(p.proargtypes), l.lanname::text, p.prosrc, p.prosecdef
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_language l ON l.oid = p.prolang
		WHERE p.proname = $1 AND (n.nspname = $2 OR n.nspname = ANY ($3))
		AND (p.pronargs = 5 OR (p.pronargs > 5 AND p.pronargs - p.pronargdefaults <= 5) OR (p.provariadic <> 0 AND p.pronargs <= 6))
		ORDER BY 2, 3`, migrations.EmitFunction, o.Schema, schemas)
	if err != nil {
		return fmt.Errorf("look up function %s: %w", migrations.EmitFunction, err)
	}
	type fn struct {
		oid            uint32
		schema, args   string
		lang, src      string
		securityDefine bool
	}
	var fns []fn
	var g fn
	if _, err := pgx.ForEachRow(rows, []any{&g.oid, &g.schema, &g.args, &g.lang, &g.src, &g.securityDefine}, func() error {
		fns = append(fns, g)
		return nil
	}); err != nil {
		return fmt.Errorf("look up function %s: %w", migrations.EmitFunction, err)
	}
	msgSrc, rowSrc := migrations.EmitMessageSource(o.MessagePrefix), migrations.EmitInsertSource(o.Layout)
	fix := "run walrelay migrate with this configuration to replace it"
	for _, f := range fns {
		name := sqlName(f.schema) + "." + migrations.EmitFunction + "(" + f.args + ")"
		switch {
		case f.schema != o.Schema:
			return fmt.Errorf("function %s is not walrelay's (that is in %s, the outbox's schema), and %s is on a search_path (of a role that may write the outbox, of this database, or walrelay's own): an application with %s before %s would call it, and its events would not reach walrelay: DROP FUNCTION %s",
				name, o.Schema, f.schema, f.schema, o.Schema, name)
		case f.args != migrations.EmitArgTypes:
			return fmt.Errorf("function %s is an overload of walrelay's %s(%s): a call may resolve to it, and its events would not reach walrelay: DROP FUNCTION %s",
				name, migrations.EmitFunction, migrations.EmitArgTypes, name)
		case f.lang == "sql" && f.src == msgSrc && !o.Messages:
			return fmt.Errorf("function %s writes events as logical decoding messages, which walrelay ignores while outbox.messages is off: "+
				"turn outbox.messages on (docs/outbox.md: Who can write events), or run walrelay migrate with this configuration to make it insert rows into the outbox", name)
		case f.lang == "sql" && (f.src == msgSrc || f.src == rowSrc):
		case strings.Contains(f.src, "pg_logical_emit_message"):
			return fmt.Errorf("function %s emits under another prefix than outbox.message_prefix %q, or not as walrelay migrate writes it, so its events would not be published: %s", name, o.MessagePrefix, fix)
		default:
			// It writes rows, perhaps into another outbox of the schema
			// (another walrelay's): they are durable in that table, not
			// lost as a message nobody reads would be.
		}
		if !f.securityDefine {
			continue
		}
		public, roles, err := nonWriters(ctx, conn, f.oid, o.Layout)
		if err != nil {
			return fmt.Errorf("read the privileges of %s: %w", name, err)
		}
		if public {
			roles = []string{"PUBLIC"}
		}
		if len(roles) > 0 {
			return fmt.Errorf("function %s is SECURITY DEFINER, and %s may execute it without INSERT on %s.%s, so it writes events with its owner's rights: %s (it makes the function SECURITY INVOKER), or REVOKE EXECUTE ON FUNCTION %s FROM %s",
				name, strings.Join(roles, ", "), o.Schema, o.Table, fix, name, strings.Join(roles, ", "))
		}
	}
	return nil
}

// searchPathSchemas lists the schemas that may come before the outbox's on
// the search_path of a role that writes it: those of walrelay's own
// session (the server's default, unless set for walrelay's role), those
// of any search_path set for this database or for every role (ALTER
// DATABASE … SET, ALTER ROLE ALL … SET), or for a role that may insert
// into the outbox or walrelay's own (ALTER ROLE … SET: any role may set
// its own, so a role that writes no events is not read), and those named
// after a role that may insert
// into the outbox l ("$user", the default's first entry). A search_path
// that a client sets on its connection is not visible here.
func searchPathSchemas(ctx context.Context, conn *pgx.Conn, l decoder.Layout) ([]string, error) {
	var schemas []string
	err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT s), '{}') FROM (
		SELECT unnest(current_schemas(false))::text AS s
		UNION ALL
		SELECT btrim(x, ' "') FROM pg_db_role_setting d, unnest(d.setconfig) c,
			regexp_split_to_table(substring(c FROM '^search_path=(.*)$'), ',') x
		WHERE d.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))
		AND (d.setrole = 0 OR d.setrole = (SELECT oid FROM pg_roles WHERE rolname = current_user) OR has_table_privilege(d.setrole, to_regclass($1), 'INSERT'))
		UNION ALL
		SELECT r.rolname::text FROM pg_roles r WHERE has_table_privilege(r.oid, to_regclass($1), 'INSERT')) q`,
		pgx.Identifier{l.Schema, l.Table}.Sanitize()).Scan(&schemas)
	if err != nil {
		return nil, fmt.Errorf("read the search_path settings: %w", err)
	}
	return schemas, nil
}

// CheckMessageHorizon reads, with the message source on, the horizon
// walrelay migrate recorded once only the outbox's writers could execute
// pg_logical_emit_message (migrations.MessageHorizon), and a recent full
// transaction id of the server: decoder.Config.MessagesFrom and XidNow.
// It refuses when none is recorded (the privileges set by hand, say): a
// message that any role emitted before then, in a transaction walrelay
// has not read yet, would be published. With the source off it reads
// nothing.
func CheckMessageHorizon(ctx context.Context, conn *pgx.Conn, o decoder.Config) (from, now uint64, err error) {
	if !o.Messages {
		return 0, 0, nil
	}
	from, ok, err := migrations.MessageHorizon(ctx, conn, o)
	if err != nil {
		return 0, 0, err
	}
	if !ok {
		o = o.WithDefaults()
		return 0, 0, fmt.Errorf("outbox.messages is on, but no horizon is recorded on %s.%s (walrelay migrate records, once the privileges of pg_logical_emit_message are right, from which transaction messages are trusted: any role may have emitted one before, still unread): run walrelay migrate with this configuration, as a superuser, even if you set the privileges by hand",
			sqlName(o.Schema), migrations.EmitFunction)
	}
	var s string
	if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text").Scan(&s); err != nil {
		return 0, 0, fmt.Errorf("read the server's transaction id: %w", err)
	}
	if now, err = strconv.ParseUint(s, 10, 64); err != nil {
		return 0, 0, fmt.Errorf("read the server's transaction id %q: %w", s, err)
	}
	return from, now, nil
}

// CheckChildPrivileges refuses an outbox table l with a partition or an
// inheritance child (at any depth) on which a role, or PUBLIC, may insert
// without INSERT on l itself, naming the REVOKE: the publication publishes
// a partition's rows as l's, so the right to write any partition is the
// right to write the outbox (a grant by ALTER DEFAULT PRIVILEGES on each
// new partition, say). Only l's owner may add a partition or a child, so
// no untrusted role can keep walrelay from starting this way.
func CheckChildPrivileges(ctx context.Context, conn *pgx.Conn, l decoder.Layout) error {
	l = l.WithDefaults()
	rows, err := conn.Query(ctx, `WITH RECURSIVE tree(oid) AS (
			SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass($1)
			UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid)
		SELECT t.oid::regclass::text, 'PUBLIC' FROM tree t JOIN pg_class c ON c.oid = t.oid, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
			WHERE a.grantee = 0 AND a.privilege_type = 'INSERT'
		UNION
		SELECT t.oid::regclass::text, r.oid::regrole::text FROM tree t, pg_roles r
			WHERE has_table_privilege(r.oid, t.oid, 'INSERT') AND NOT has_table_privilege(r.oid, to_regclass($1), 'INSERT')
		ORDER BY 1, 2`, pgx.Identifier{l.Schema, l.Table}.Sanitize())
	if err != nil {
		return fmt.Errorf("read the privileges of the partitions of %s: %w", l.Name(), err)
	}
	var child, role string
	var problems []string
	if _, err := pgx.ForEachRow(rows, []any{&child, &role}, func() error {
		problems = append(problems, fmt.Sprintf("%s may insert into %s: REVOKE INSERT ON %s FROM %s (and, if ALTER DEFAULT PRIVILEGES gave it, ALTER DEFAULT PRIVILEGES … REVOKE INSERT ON TABLES FROM %s), or GRANT INSERT ON %s TO %s if it writes events",
			role, child, child, role, role, sqlName(l.Schema)+"."+sqlName(l.Table), role))
		return nil
	}); err != nil {
		return fmt.Errorf("read the privileges of the partitions of %s: %w", l.Name(), err)
	}
	if len(problems) > 0 {
		return fmt.Errorf("a role that may not insert into %s may insert into a partition (or inheritance child) of it, whose rows walrelay publishes as the outbox's: %s",
			l.Name(), strings.Join(problems, "; "))
	}
	return nil
}

// CheckMessageTableRules refuses, with the message source on, an outbox
// table (the first of o) with row-level security enabled or a CHECK
// constraint: they confine what a writer may insert, and a writer's
// message (pg_logical_emit_message, walrelay_emit) writes no row, so they
// would not apply to it. A BEFORE INSERT trigger, which may validate a row
// or only fill it in, is returned as a warning. With the source off it
// checks nothing.
func CheckMessageTableRules(ctx context.Context, conn *pgx.Conn, o decoder.Config) (warnings []string, err error) {
	if !o.Messages {
		return nil, nil
	}
	o = o.WithDefaults()
	name := pgx.Identifier{o.Schema, o.Table}.Sanitize()
	var rls bool
	var checks, triggers []string
	err = conn.QueryRow(ctx, `SELECT c.relrowsecurity,
			coalesce((SELECT array_agg(conname::text ORDER BY conname) FROM pg_constraint WHERE conrelid = c.oid AND contype = 'c'), '{}'),
			coalesce((SELECT array_agg(tgname::text ORDER BY tgname) FROM pg_trigger WHERE tgrelid = c.oid AND NOT tgisinternal AND tgtype & 2 = 2 AND tgtype & 4 = 4), '{}')
		FROM pg_class c WHERE c.oid = to_regclass($1)`, name).Scan(&rls, &checks, &triggers)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil // CheckTable says it is missing
	}
	if err != nil {
		return nil, fmt.Errorf("read the rules of %s: %w", o.Name(), err)
	}
	var problems []string
	if rls {
		problems = append(problems, "row-level security is enabled on it (ALTER TABLE "+name+" DISABLE ROW LEVEL SECURITY, once no writer relies on it)")
	}
	for _, c := range checks {
		problems = append(problems, "CHECK constraint "+sqlName(c)+" (ALTER TABLE "+name+" DROP CONSTRAINT "+sqlName(c)+")")
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("outbox.messages is on, but %s confines what a writer may insert, and a message writes no row, so it would not apply to the events written as messages: %s; or turn outbox.messages off and write events as rows",
			o.Name(), strings.Join(problems, "; "))
	}
	for _, tg := range triggers {
		warnings = append(warnings, fmt.Sprintf("outbox.messages is on, and BEFORE INSERT trigger %s on %s does not run for events written as messages (no row is written): if it validates rows, a writer's message bypasses it; turn outbox.messages off to keep it", sqlName(tg), o.Name()))
	}
	return warnings, nil
}
