package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/sqlquote"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/replication"
)

// hostileNames are names that try to end the SQL walrelay writes them
// into and run their own: past a dollar tag (the fixed $$ of
// walrelay_emit, $walrelay_inbox$ of the inbox, $body$ of sqlquote.Dollar),
// a quoted identifier, a literal (with standard_conforming_strings off as
// well), with control characters, or long enough that PostgreSQL cuts
// them. Each would create public.pwned, or make a role a superuser.
var hostileNames = []string{
	"payload$$; CREATE TABLE public.pwned(); SELECT $$",
	"payload$$; ALTER ROLE app SUPERUSER; SELECT $$",
	"x$walrelay_inbox$; CREATE TABLE public.pwned(); SELECT $walrelay_inbox$",
	"x$body$; CREATE TABLE public.pwned(); SELECT $body$",
	"$$",
	`x"; CREATE TABLE public.pwned(); --`,
	`x'; CREATE TABLE public.pwned(); --`,
	`x\'; CREATE TABLE public.pwned(); --`,
	"x\n; CREATE TABLE public.pwned(); --",
	"a\x00b",
	"a\rb",
	strings.Repeat("a", 64),
	strings.Repeat("a", 50),
	"Ünïcødé 表",
	"with space",
	"MixedCase",
	`"quoted"`,
	`back\slash`,
}

// hostileCount numbers the schemas of the hostile-name runs in this process.
var hostileCount atomic.Int64

// hostileServer is a server whose every DDL command is recorded by an event
// trigger: any outside the schema a run names (the setting
// walrelay_test.schema) counts in the sequence public.walrelay_unexpected,
// which no rollback takes back; and whose sessions do not check function
// bodies (check_function_bodies off for the database, as a role or
// database may set it), so a body cut short by a name is not refused by
// PostgreSQL's check but by walrelay's quoting.
func hostileServer(t testing.TB) *pgx.Conn {
	t.Helper()
	pg := pgtest.Start(t)
	conn := pgtest.Connect(t, pg.DSN)
	setup := `
CREATE ROLE app LOGIN;
CREATE SEQUENCE public.walrelay_unexpected;
CREATE TABLE public.walrelay_unexpected_log (what text);
CREATE FUNCTION public.walrelay_audit() RETURNS event_trigger LANGUAGE plpgsql AS $f$
DECLARE r record;
BEGIN
    FOR r IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
        IF r.schema_name IS DISTINCT FROM current_setting('walrelay_test.schema', true)
           AND r.command_tag NOT IN ('CREATE PUBLICATION', 'ALTER PUBLICATION')
           AND NOT (r.command_tag = 'CREATE SCHEMA' AND r.object_identity = current_setting('walrelay_test.schema', true))
           AND NOT (r.command_tag = 'CREATE TRIGGER' AND r.object_identity LIKE '% on ' || current_setting('walrelay_test.schema', true) || '.%') THEN
            RAISE WARNING 'unexpected: % % %', r.command_tag, r.schema_name, r.object_identity;
            PERFORM nextval('public.walrelay_unexpected');
            INSERT INTO public.walrelay_unexpected_log VALUES (concat_ws(' ', r.command_tag, r.schema_name, r.object_identity));
        END IF;
    END LOOP;
END $f$;
CREATE EVENT TRIGGER walrelay_audit ON ddl_command_end EXECUTE FUNCTION public.walrelay_audit();
ALTER DATABASE postgres SET check_function_bodies = off;`
	if _, err := conn.Exec(t.Context(), setup); err != nil {
		t.Fatal(err)
	}
	conn.Close(t.Context())
	return pgtest.Connect(t, pg.DSN)
}

// catalog is what a run may not change outside its own schema: the roles
// and their settings, the objects of every other schema, the unexpected
// DDL commands.
func catalog(ctx context.Context, t testing.TB, conn *pgx.Conn, schema string) string {
	t.Helper()
	var s string
	err := conn.QueryRow(ctx, `SELECT concat_ws(' | ',
		(SELECT string_agg(concat_ws(',', rolname, rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls, rolcanlogin), ';' ORDER BY rolname) FROM pg_authid),
		(SELECT count(*) FROM pg_db_role_setting),
		(SELECT string_agg(nspname, ',' ORDER BY nspname) FROM pg_namespace WHERE nspname <> $1),
		(SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname NOT IN ($1, 'pg_toast')),
		(SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname <> $1),
		(SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname <> $1),
		(SELECT last_value FROM public.walrelay_unexpected))`, schema).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// applyHostile runs every migration walrelay writes (the outbox table with
// a header and a trace column, walrelay_emit inserting or emitting under
// name as the prefix (with messages), the poll source's objects, the inbox, the
// publication) with name as the table, a column, a header column and the
// inbox table, in a schema of its own, and checks that nothing but the
// intended objects came of it: no DDL outside that schema, no role
// changed, and, if the migrations succeeded, exactly the intended tables
// and functions there, walrelay_emit's body as written. It returns the
// first migration's error.
func applyHostile(t *testing.T, conn *pgx.Conn, name string, messages bool) error {
	ctx := t.Context()
	n := hostileCount.Add(1)
	schema := fmt.Sprintf("w%d", n)
	if _, err := conn.Exec(ctx, "SET walrelay_test.schema = "+schema+"; CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	// Publications are not in a schema: each run's is dropped after it.
	pub := fmt.Sprintf("p%d %s", n, name)
	if len(pub) > 63 {
		pub = pub[:63]
	}
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "SET walrelay_test.schema = "+schema+"; DROP SCHEMA "+schema+" CASCADE; DROP PUBLICATION IF EXISTS "+pgx.Identifier{pub}.Sanitize())
	})
	before := catalog(ctx, t, conn, schema)
	o := decoder.Config{Messages: messages}
	if messages {
		o.MessagePrefix = name
	}
	o.Schema, o.Table = schema, name
	o.Columns.Payload = name
	o.HeaderColumns = []string{name + "_h"}
	o.TraceColumn = "t" + name
	emitBody := func() string {
		var body string
		if err := conn.QueryRow(ctx, `SELECT coalesce(string_agg(p.prosrc, ' | '), '') FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace
			WHERE s.nspname = $1 AND p.proname = $2`, schema, migrations.EmitFunction).Scan(&body); err != nil {
			t.Fatal(err)
		}
		return body
	}
	err := func() error {
		if _, err := migrations.Apply(ctx, conn, o); err != nil {
			return fmt.Errorf("apply: %w", err)
		}
		want := migrations.EmitInsertSource(o.Layout)
		if o.Messages {
			want = migrations.EmitMessageSource(o.WithDefaults().MessagePrefix)
		}
		if got := emitBody(); got != want {
			t.Errorf("name %q: walrelay_emit's body %q, want %q", name, got, want)
		}
		if _, err := migrations.ApplyPoll(ctx, conn, decoder.Config{Layout: o.Layout}); err != nil {
			return fmt.Errorf("apply poll: %w", err)
		}
		// migrate --poll makes walrelay_emit insert a row.
		if got, want := emitBody(), migrations.EmitInsertSource(o.Layout); got != want {
			t.Errorf("name %q: after the poll migration walrelay_emit's body %q, want %q", name, got, want)
		}
		if err := migrations.ApplyInbox(ctx, conn, schema, "i"+name); err != nil {
			return fmt.Errorf("apply inbox: %w", err)
		}
		if _, _, err := replication.EnsurePublication(ctx, conn, relay.PublicationSpec(o, pub, false)); err != nil {
			return fmt.Errorf("publication: %w", err)
		}
		return nil
	}()
	if after := catalog(ctx, t, conn, schema); after != before {
		b, a := strings.Split(before, " | "), strings.Split(after, " | ")
		for i, what := range []string{"roles", "role settings", "schemas", "relations", "functions", "triggers", "unexpected DDL"} {
			if i < len(b) && i < len(a) && b[i] != a[i] {
				var log string
				_ = conn.QueryRow(ctx, "SELECT coalesce(string_agg(what, '; '), '') FROM public.walrelay_unexpected_log").Scan(&log)
				t.Errorf("name %q: outside schema %s the %s changed: before %s, after %s (unexpected DDL committed: %s)", name, schema, what, b[i], a[i], log)
			}
		}
	}
	if err != nil {
		return err
	}
	var tables, funcs int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = $1 AND c.relkind = 'r'),
		(SELECT count(*) FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace WHERE s.nspname = $1)`, schema).Scan(&tables, &funcs); err != nil {
		t.Fatal(err)
	}
	if tables != 2 || funcs != 4 {
		t.Errorf("name %q: in schema %s %d tables, %d functions; want 2 (the outbox, the inbox) and 4 (walrelay_emit, walrelay_poll_notify, the two claims)", name, schema, tables, funcs)
	}
	return nil
}

// TestHostileNamesRunNoOtherStatement: a name that could end the SQL it
// is written into (a dollar tag, a quote, a control character) or that
// PostgreSQL would cut is refused before any statement runs, naming the
// rule; a name that merely looks odd (spaces, case, quotes, backslashes,
// Unicode) is quoted and works; either way, with function bodies
// unchecked by the server, no statement but walrelay's own runs.
func TestHostileNamesRunNoOtherStatement(t *testing.T) {
	t.Parallel()
	conn := hostileServer(t)
	for _, name := range hostileNames {
		for _, messages := range []bool{false, true} {
			// The longest name walrelay derives: the poll source's index.
			refuse := sqlquote.CheckName(name+"_walrelay_unsent") != nil
			err := applyHostile(t, conn, name, messages)
			switch {
			case refuse && err == nil:
				t.Errorf("name %q (messages %t): accepted, want it refused", name, messages)
			case !refuse && err != nil:
				t.Errorf("name %q (messages %t): %v, want it created", name, messages, err)
			case refuse && !strings.Contains(err.Error(), "name "):
				t.Errorf("name %q (messages %t): %v, want a refusal naming the rule", name, messages, err)
			}
		}
	}
}

// FuzzHostileNames: whatever the name, the migrations run no statement
// but their own (applyHostile's checks). CI runs it briefly.
func FuzzHostileNames(f *testing.F) {
	for _, name := range hostileNames {
		f.Add(name, false)
		f.Add(name, true)
	}
	conn := hostileServer(f)
	f.Fuzz(func(t *testing.T, name string, messages bool) {
		_ = applyHostile(t, conn, name, messages)
	})
}

// TestInboxTablesThatPostgreSQLWouldCutAreRefused: two inbox tables whose
// names share their first 57 bytes would get one claim function (<table>_claim,
// cut to 63 bytes), the second migration replacing the first's; the
// longest inbox table name whose derived names PostgreSQL keeps whole (50
// bytes) is taken, a longer one is refused naming the limit, by the
// migration and by inbox.New alike.
func TestInboxTablesThatPostgreSQLWouldCutAreRefused(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pg := pgtest.Start(t)
	conn := pgtest.Connect(t, pg.DSN)
	pool, err := pgxpool.New(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	prefix := strings.Repeat("i", 57)
	for _, table := range []string{prefix + "_a", prefix + "_b"} {
		err := migrations.ApplyInbox(ctx, conn, "public", table)
		if err == nil || !strings.Contains(err.Error(), "at most 50 bytes") {
			t.Errorf("inbox table of %d bytes: %v, want it refused naming the limit of 50 bytes", len(table), err)
		}
		if _, err := inbox.New(inbox.Config{Postgres: pool, Brokers: []string{"127.0.0.1:1"}, Table: table, Topics: []string{"t"}, Group: "g"}); err == nil || !strings.Contains(err.Error(), "at most 50 bytes") {
			t.Errorf("inbox.New with a table of %d bytes: %v, want it refused naming the limit of 50 bytes", len(table), err)
		}
	}
	table := strings.Repeat("i", 50)
	if err := migrations.ApplyInbox(ctx, conn, "public", table); err != nil {
		t.Fatalf("inbox table of 50 bytes: %v", err)
	}
	var claims int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_proc WHERE proname = $1", table+"_claim").Scan(&claims); err != nil {
		t.Fatal(err)
	}
	if claims != 2 {
		t.Errorf("%d claim functions named %s_claim, want 2", claims, table)
	}
}
