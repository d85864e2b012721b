package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/sqlquote"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/poll"
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
	"p$$;GRANT pg_read_server_files TO app;SELECT $$",
	"x$walrelay$; UPDATE public.sentinel SET v = 'pwned'; SELECT $walrelay$",
	"x\u202e",
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
// which no rollback takes back. Its database does not check function
// bodies (check_function_bodies off, as a role or database may set it).
// public.sentinel holds a row an injected statement could change.
func hostileServer(t testing.TB) *pgx.Conn {
	t.Helper()
	pg := pgtest.Start(t)
	conn := pgtest.Connect(t, pg.DSN)
	setup := `
CREATE ROLE app LOGIN;
CREATE TABLE public.sentinel (v text);
INSERT INTO public.sentinel VALUES ('untouched');
CREATE SEQUENCE public.walrelay_unexpected;
CREATE TABLE public.walrelay_unexpected_log (what text);
CREATE FUNCTION public.walrelay_audit() RETURNS event_trigger LANGUAGE plpgsql AS $f$
DECLARE r record;
BEGIN
    FOR r IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
        IF r.schema_name IS DISTINCT FROM current_setting('walrelay_test.schema', true)
           AND r.command_tag NOT IN ('CREATE PUBLICATION', 'ALTER PUBLICATION')
           AND NOT (r.command_tag = 'CREATE SCHEMA' AND r.object_identity = quote_ident(current_setting('walrelay_test.schema', true)))
           AND NOT (r.command_tag = 'CREATE TRIGGER' AND position(' on ' || quote_ident(current_setting('walrelay_test.schema', true)) || '.' in r.object_identity) > 0) THEN
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

// catalogParts name the parts of catalog's text, in its order.
var catalogParts = []string{"roles", "role memberships", "role and database settings", "default privileges", "databases and their privileges",
	"schemas and their privileges", "relations and their privileges", "functions and their privileges", "triggers", "the sentinel row", "unexpected DDL"}

// catalog is what a run may not change outside its own schema: the roles,
// their memberships and settings, default privileges, the databases, the
// objects of every other schema and their privileges, the sentinel row,
// the unexpected DDL commands.
func catalog(ctx context.Context, t testing.TB, conn *pgx.Conn, schema string) string {
	t.Helper()
	var s string
	err := conn.QueryRow(ctx, `SELECT concat_ws(' | ',
		(SELECT string_agg(concat_ws(',', rolname, rolsuper, rolinherit, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls, rolcanlogin, rolpassword, rolvaliduntil), ';' ORDER BY rolname) FROM pg_authid),
		(SELECT coalesce(string_agg(concat_ws(',', roleid, member, admin_option), ';' ORDER BY roleid, member), '') FROM pg_auth_members),
		(SELECT coalesce(string_agg(concat_ws(',', setdatabase, setrole, setconfig::text), ';' ORDER BY setdatabase, setrole), '') FROM pg_db_role_setting),
		(SELECT coalesce(string_agg(concat_ws(',', defaclrole, defaclnamespace, defaclobjtype, defaclacl::text), ';' ORDER BY oid), '') FROM pg_default_acl),
		(SELECT string_agg(concat_ws(',', datname, datacl::text, datallowconn), ';' ORDER BY datname) FROM pg_database),
		(SELECT string_agg(concat_ws(',', nspname, nspacl::text), ';' ORDER BY nspname) FROM pg_namespace WHERE nspname <> $1),
		(SELECT md5(string_agg(concat_ws(',', c.oid, c.relname, c.relacl::text, c.relkind), ';' ORDER BY c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname NOT IN ($1, 'pg_toast')),
		(SELECT md5(string_agg(concat_ws(',', p.oid, p.proname, p.proacl::text, md5(p.prosrc)), ';' ORDER BY p.oid)) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname <> $1),
		(SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname <> $1),
		(SELECT string_agg(v, ',') FROM public.sentinel),
		(SELECT last_value FROM public.walrelay_unexpected))`, schema).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// applyHostile runs every migration walrelay writes with name in every
// position, in a schema named after it: the outbox table, its columns (the
// payload's name itself, the others with a suffix), a header column and
// the trace column; walrelay_emit inserting, or (with messages) emitting
// under name as the prefix; the poll source's objects; the inbox table;
// the publication. It checks that nothing but the intended came of it: no
// DDL outside that schema, no role, membership, setting, privilege,
// object of another schema or sentinel row changed; and, if the
// migrations succeeded, exactly the intended tables and functions there,
// walrelay_emit's body as written, and each function working as it
// should (an emitted event lands in the table, a claim is new once). It
// returns the first migration's error.
func applyHostile(t *testing.T, conn *pgx.Conn, name string, messages bool) error {
	ctx := t.Context()
	n := hostileCount.Add(1)
	// The schema is named after name too; a name PostgreSQL cannot take
	// (a NUL, not UTF-8) gets a plain schema, and is refused all the same.
	schema := fmt.Sprintf("w%d %s", n, name)
	if len(schema) > 63 || strings.ContainsRune(name, 0) || !utf8.ValidString(name) {
		schema = fmt.Sprintf("w%d", n)
	}
	if _, err := conn.Exec(ctx, "SELECT set_config('walrelay_test.schema', $1, false)", schema); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	// Publications are not in a schema: each run's is dropped after it.
	pub := fmt.Sprintf("p%d %s", n, name)
	if len(pub) > 63 || strings.ContainsRune(name, 0) || !utf8.ValidString(name) {
		pub = fmt.Sprintf("p%d", n)
	}
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		_, _ = conn.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+pgx.Identifier{pub}.Sanitize())
	})
	before := catalog(ctx, t, conn, schema)
	o := decoder.Config{Messages: messages}
	if messages {
		o.MessagePrefix = name
	}
	o.Schema, o.Table = schema, name
	c := &o.Columns
	c.ID, c.AggregateType, c.AggregateID, c.Type, c.Payload = name+"_i", name+"_at", name+"_ai", name+"_t", name
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
	inboxTable := "i" + name
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
		if err := migrations.ApplyInbox(ctx, conn, schema, inboxTable); err != nil {
			return fmt.Errorf("apply inbox: %w", err)
		}
		if _, _, err := replication.EnsurePublication(ctx, conn, relay.PublicationSpec(o, pub, false)); err != nil {
			return fmt.Errorf("publication: %w", err)
		}
		return nil
	}()
	if after := catalog(ctx, t, conn, schema); after != before {
		var log string
		_ = conn.QueryRow(ctx, "SELECT coalesce(string_agg(what, '; '), '') FROM public.walrelay_unexpected_log").Scan(&log)
		b, a := strings.Split(before, " | "), strings.Split(after, " | ")
		for i, what := range catalogParts {
			if i < len(b) && i < len(a) && b[i] != a[i] {
				t.Errorf("name %q: outside schema %q the %s changed: before %s, after %s (unexpected DDL committed: %s)", name, schema, what, b[i], a[i], log)
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
	if tables != 3 || funcs != 4 {
		t.Errorf("name %q: in schema %q %d tables, %d functions; want 3 (the outbox, the inbox, its versions) and 4 (walrelay_emit, walrelay_poll_notify, the two claims)", name, schema, tables, funcs)
	}
	// The functions do what they say: a body cut short by a name would
	// not.
	l := o.WithDefaults().Layout // an empty name is the default's
	table := pgx.Identifier{schema, l.Table}.Sanitize()
	var rows int
	if _, err := conn.Exec(ctx, "SELECT "+pgx.Identifier{schema, migrations.EmitFunction}.Sanitize()+"(gen_random_uuid(), 'order', 'o-1', 'Placed', '{}')"); err != nil {
		t.Errorf("name %q: walrelay_emit: %v", name, err)
	} else if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE "+pgx.Identifier{l.Columns.AggregateID}.Sanitize()+" = 'o-1'").Scan(&rows); err != nil {
		t.Fatal(err)
	} else if rows != 1 {
		t.Errorf("name %q: walrelay_emit wrote %d rows into %s, want 1", name, rows, table)
	}
	claim := migrations.InboxClaimFunction(schema, inboxTable)
	var first, again, other bool
	if err := conn.QueryRow(ctx, "SELECT "+claim+"('c', 't', 'e1'), "+claim+"('c', 't', 'e1'), "+claim+"('c', 'e2')").Scan(&first, &again, &other); err != nil {
		t.Errorf("name %q: the inbox's claims: %v", name, err)
	} else if !first || again || !other {
		t.Errorf("name %q: the inbox's claims answered new %t, again %t, another id %t; want true, false, true", name, first, again, other)
	}
	return nil
}

// TestHostileNamesRunNoOtherStatement: a name that looks like SQL (a
// dollar tag, a quote, a backslash, Unicode, spaces) in every position of
// every migration is quoted and works, and runs no statement of its own,
// with the server checking the bodies and, to show that the quoting alone
// holds, without; a name with a control character, or one that
// PostgreSQL would cut (or cut in a name derived from it), is refused
// before any statement runs, naming the rule.
func TestHostileNamesRunNoOtherStatement(t *testing.T) {
	conn := hostileServer(t)
	for _, checked := range []bool{true, false} {
		if !checked {
			defer migrations.UncheckedFunctionBodies()()
		}
		for _, name := range hostileNames {
			for _, messages := range []bool{false, true} {
				// A control character, or longer than a new poll table may
				// be (47 bytes, for its <table>_walrelay_unsent).
				refuse := sqlquote.CheckName(name) != nil || len(name) > 47
				err := applyHostile(t, conn, name, messages)
				switch {
				case refuse && err == nil:
					t.Errorf("name %q (messages %t, bodies checked %t): accepted, want it refused", name, messages, checked)
				case !refuse && err != nil:
					t.Errorf("name %q (messages %t, bodies checked %t): %v, want it created", name, messages, checked, err)
				case refuse && !strings.Contains(err.Error(), "name "):
					t.Errorf("name %q (messages %t, bodies checked %t): %v, want a refusal naming the rule", name, messages, checked, err)
				}
			}
		}
	}
}

// FuzzHostileNames: whatever the name, the migrations run no statement
// but their own (applyHostile's checks), the server not checking the
// bodies. CI runs it briefly.
func FuzzHostileNames(f *testing.F) {
	for _, name := range hostileNames {
		f.Add(name, false)
		f.Add(name, true)
	}
	conn := hostileServer(f)
	defer migrations.UncheckedFunctionBodies()()
	f.Fuzz(func(t *testing.T, name string, messages bool) {
		_ = applyHostile(t, conn, name, messages)
	})
}

// TestInboxTablesThatPostgreSQLWouldCutAreRefused: two inbox tables whose
// names share their first 57 bytes would get one claim function
// (<table>_claim, cut to 63 bytes), the second migration replacing the
// first's; a new inbox table whose derived names PostgreSQL keeps whole
// (50 bytes) is created, a longer one is refused naming the limit. An
// inbox table of such a name that exists already (made before the rule)
// is migrated as before, and inbox.New takes it.
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
	old := prefix + "_old"
	if _, err := conn.Exec(ctx, "CREATE TABLE "+pgx.Identifier{old}.Sanitize()+" (consumer text NOT NULL, event_id text NOT NULL, processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (consumer, event_id))"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.ApplyInbox(ctx, conn, "public", old); err != nil {
		t.Errorf("an inbox table of %d bytes that exists: %v", len(old), err)
	}
	if _, err := inbox.New(inbox.Config{Postgres: pool, Brokers: []string{"127.0.0.1:1"}, Table: old, Topics: []string{"t"}, Group: "g"}); err != nil {
		t.Errorf("inbox.New with an inbox table of %d bytes that exists: %v", len(old), err)
	}
}

// TestPollIndexNamesApart: the poll source's three indexes are named
// after the table (<table>_walrelay_due, _unsent, _parked); PostgreSQL
// keeps 63 bytes of a name, so for a table of 53 bytes or more all three
// are <table>_walrelay_, and only the first was ever built, the other two
// skipped by IF NOT EXISTS, with nothing reported (and the checks, which
// compared the cut names, found the one index three times). Such a table
// is refused by migrate --poll and by the poll source's start, naming the
// limit of 52 bytes; one of 52 bytes (as an earlier version left it) gets
// its three indexes, their names cut but apart; a new one is refused
// beyond 47 bytes (TestHostileNamesRunNoOtherStatement). An index
// of created_at whose name another relation holds is refused naming the
// holder; a new outbox table of 53 bytes (its index's name cut) is
// refused; an existing one gets the column.
func TestPollIndexNamesApart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pg := pgtest.Start(t)
	conn := pgtest.Connect(t, pg.DSN)
	long := decoder.Config{}
	long.Table = strings.Repeat("o", 53)
	// As an earlier version left it: the poll columns there, the indexes
	// not.
	if _, err := conn.Exec(ctx, "CREATE TABLE "+long.Table+" (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb, status text NOT NULL DEFAULT 'PENDING')"); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.ApplyPoll(ctx, conn, long); err == nil || !strings.Contains(err.Error(), "at most 52 bytes") {
		t.Errorf("migrate --poll of a table of 53 bytes: %v, want it refused naming the limit of 52 bytes", err)
	}
	if err := poll.CheckTable(ctx, conn, long.Layout); err == nil || !strings.Contains(err.Error(), "at most 52 bytes") {
		t.Errorf("the poll source's check of a table of 53 bytes: %v, want it refused naming the limit of 52 bytes", err)
	}
	// One of 52 bytes as an earlier version left it: its index names are
	// cut, but stay apart.
	fits := decoder.Config{}
	fits.Table = strings.Repeat("f", 52)
	if _, err := conn.Exec(ctx, "CREATE TABLE "+fits.Table+" (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb, status text NOT NULL DEFAULT 'PENDING')"); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.ApplyPoll(ctx, conn, fits); err != nil {
		t.Fatalf("migrate --poll of a table of 52 bytes: %v", err)
	}
	var built int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_index WHERE indrelid = to_regclass($1) AND indexrelid::regclass::text LIKE '%walrelay%'", fits.Table).Scan(&built); err != nil {
		t.Fatal(err)
	}
	if built != 3 {
		t.Errorf("a table of 52 bytes: %d poll indexes built, want 3", built)
	}
	if err := poll.CheckTable(ctx, conn, fits.Layout); err != nil {
		t.Errorf("the poll source's check of a table of 52 bytes: %v", err)
	}
	// A table that exists, without created_at, whose index would take the
	// name of another relation (a table named so): refused naming it,
	// not skipped by IF NOT EXISTS.
	holder, lacking := strings.Repeat("t", 52)+"_created_at", decoder.Config{}
	lacking.Table = strings.Repeat("t", 52)
	if _, err := conn.Exec(ctx, "CREATE TABLE "+holder+" (); CREATE TABLE "+lacking.Table+" (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)"); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, conn, lacking); err == nil || !strings.Contains(err.Error(), "is held by "+holder) {
		t.Errorf("created_at's index of a table whose name another relation holds: %v, want it refused naming the holder", err)
	}
	// A new outbox table of 53 bytes: its created_at index would be cut.
	fresh := decoder.Config{}
	fresh.Table = strings.Repeat("n", 53)
	if _, err := migrations.Apply(ctx, conn, fresh); err == nil || !strings.Contains(err.Error(), "at most 52 bytes") {
		t.Errorf("a new outbox table of 53 bytes: %v, want it refused naming the limit of 52 bytes", err)
	}
	// One of 53 bytes that exists, without created_at: given it, its
	// index cut to 63 bytes (no other relation holds that name).
	old := decoder.Config{}
	old.Table = strings.Repeat("e", 53)
	if _, err := conn.Exec(ctx, "CREATE TABLE "+old.Table+" (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)"); err != nil {
		t.Fatal(err)
	}
	if res, err := migrations.Apply(ctx, conn, old); err != nil || len(res.CreatedAt) != 1 {
		t.Errorf("an existing outbox table of 53 bytes without created_at: %+v, %v, want the column added", res, err)
	}
}
