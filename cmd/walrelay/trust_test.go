package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/outbox"
)

// The tests of this file are the trust boundary: only a role that may write
// the outbox can publish an event through walrelay, and no role can stop it.

// asRole creates a login role name (with the grants given, if any) and
// connects as it.
func asRole(t *testing.T, pg *pgtest.Server, su *pgx.Conn, name string, grants ...string) *pgx.Conn {
	t.Helper()
	execSQL(t, su, "CREATE ROLE "+name+" LOGIN")
	execSQL(t, su, grants...)
	return connect(t, strings.Replace(pg.DSN, "postgres@", name+"@", 1))
}

// running fails the test if p has ended.
func (p *proc) running() {
	p.t.Helper()
	select {
	case <-p.done:
		p.t.Fatalf("walrelay ended:\n%s", tail(p.out.String(), 3000))
	default:
	}
}

// forgedEvent is a message under walrelay's prefix, as an outbox event.
func forgedEvent(id string) string {
	return `{"id": "` + id + `", "aggregatetype": "payments", "aggregateid": "acct-1", "type": "RefundApproved", "payload": {"amount": 1000000}}`
}

// TestForgedMessageFromAnyRole: a role refused INSERT on the outbox emits a
// logical decoding message under walrelay's prefix, as PUBLIC's EXECUTE on
// pg_logical_emit_message lets it; with the default configuration (the
// message source off) nothing of it reaches Kafka, and walrelay goes on.
// (Before, it was published to outbox.event.payments like a row.)
func TestForgedMessageFromAnyRole(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	su := connect(t, pg.DSN)
	mallory := asRole(t, pg, su, "mallory")
	if _, err := mallory.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'payments', 'acct-1', 'RefundApproved', '{}')"); err == nil {
		t.Fatal("mallory may insert into the outbox")
	}
	admin := freeAddr(t)
	p := streaming(t, baseEnv(pg, kc).with("WALRELAY_ADMIN_LISTEN", admin))
	forged := outbox.NewID()
	execSQL(t, mallory, "SELECT pg_logical_emit_message(true, 'walrelay', '"+forgedEvent(forged)+"')",
		"SELECT pg_logical_emit_message(false, 'walrelay', '"+forgedEvent(outbox.NewID())+"')")
	real := outbox.NewID()
	execSQL(t, su, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('"+real+"', 'payments', 'acct-1', 'Captured', '{}')")
	waitAll(t, col, []string{real}, time.Minute)
	time.Sleep(300 * time.Millisecond) // a forged event would be in the same round or the one before
	for _, r := range col.Records() {
		if strings.Contains(string(r.Value), "1000000") || r.Topic == kc.dlq() {
			t.Fatalf("a forged message reached Kafka: topic %s value %s", r.Topic, r.Value)
		}
	}
	p.running()
	if n := metric(t, admin, "walrelay_changes_ignored_total", `kind="message_source_off"`); n != 2 {
		t.Errorf("walrelay_changes_ignored_total{kind=\"message_source_off\"} = %v, want 2", n)
	}
}

// TestForeignPrefixDoesNotStopTheRelay: messages under a prefix walrelay
// does not read, which any role can emit, in a transaction or not, are
// ignored, counted and logged once per prefix; walrelay streams on, and
// a restart reads past them too. (Before, the first one stopped walrelay,
// and every restart again.)
func TestForeignPrefixDoesNotStopTheRelay(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	su := connect(t, pg.DSN)
	mallory := asRole(t, pg, su, "mallory")
	admin := freeAddr(t)
	e := baseEnv(pg, kc).with("WALRELAY_ADMIN_LISTEN", admin)
	p := streaming(t, e)
	insert := func() string {
		id := outbox.NewID()
		execSQL(t, su, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('"+id+"', 'order', 'o-1', 'Placed', '{}')")
		return id
	}
	first := insert()
	waitAll(t, col, []string{first}, time.Minute)
	execSQL(t, mallory, "SELECT pg_logical_emit_message(true, 'not-walrelay', 'y')",
		"SELECT pg_logical_emit_message(false, 'not-walrelay', 'z')",
		"SELECT pg_logical_emit_message(true, 'walrelay.heartbeat', 'forged beat')")
	later := insert()
	waitAll(t, col, []string{first, later}, 30*time.Second)
	p.running()
	if n := metric(t, admin, "walrelay_changes_ignored_total", `kind="message_foreign_prefix"`); n != 2 {
		t.Errorf("walrelay_changes_ignored_total{kind=\"message_foreign_prefix\"} = %v, want 2", n)
	}
	if n := strings.Count(p.out.String(), `prefix=not-walrelay`); n != 1 {
		t.Errorf("the prefix was logged %d times, want once:\n%s", n, tail(p.out.String(), 3000))
	}
	if len(col.Records()) != 2 {
		t.Fatalf("%d records, want the 2 rows", len(col.Records()))
	}
}

// TestMessageSourceNeedsItsPrivileges: with outbox.messages on, check and
// run refuse while PUBLIC (or any role without INSERT on the outbox) may
// execute pg_logical_emit_message, naming the REVOKE and the GRANT; migrate
// gives the privileges; then a role without INSERT is refused by
// PostgreSQL, and a writer's walrelay_emit is published.
func TestMessageSourceNeedsItsPrivileges(t *testing.T) {
	t.Parallel()
	pg, kc, col, su := bareSetup(t)
	e := baseEnv(pg, kc).with("WALRELAY_OUTBOX_MESSAGES", "true")
	mustRun(t, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate")
	app := asRole(t, pg, su, "app", "GRANT INSERT, SELECT ON outbox TO app")
	mallory := asRole(t, pg, su, "mallory")
	const revoke = "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) FROM PUBLIC"
	const grant = "GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) TO"
	for _, cmd := range []string{"run", "check"} {
		code, out := runCmd(t, e, cmd)
		if code == 0 || !strings.Contains(out, revoke) || !strings.Contains(out, grant) || !strings.Contains(out, "bytea) FROM PUBLIC") {
			t.Fatalf("%s: exit %d, want a refusal naming %q and %q:\n%s", cmd, code, revoke, grant, tail(out, 3000))
		}
	}
	if code, out := runCmd(t, e, "migrate"); code != 0 {
		t.Fatalf("migrate with outbox.messages: exit %d\n%s", code, out)
	}
	_, err := mallory.Exec(t.Context(), "SELECT pg_logical_emit_message(true, 'walrelay', '"+forgedEvent(outbox.NewID())+"')")
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("mallory's pg_logical_emit_message: %v, want permission denied (42501)", err)
	}
	if code, out := runCmd(t, e, "check"); strings.Contains(out, "FAIL  messages") || strings.Contains(out, "FAIL  walrelay_emit") {
		t.Fatalf("check after migrate: exit %d\n%s", code, out)
	}
	p := streaming(t, e)
	id := outbox.NewID()
	execSQL(t, app, fmt.Sprintf(`SELECT walrelay_emit('%s', 'invoice', 'inv-1', 'Issued', '{"n": 1}')`, id))
	waitAll(t, col, []string{id}, time.Minute)
	if rows := texts(t, su, "SELECT id::text FROM outbox"); len(rows) != 0 {
		t.Fatalf("walrelay_emit wrote rows %v, want a message", rows)
	}
	p.signal(15)
	p.exit(time.Minute)

	// A role without INSERT given EXECUTE by hand: refused again.
	execSQL(t, su, "GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, bytea) TO mallory")
	code, out := runCmd(t, e, "run")
	if code == 0 || !strings.Contains(lastLine(out), "mallory") || !strings.Contains(lastLine(out), "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, bytea) FROM mallory") {
		t.Fatalf("run: exit %d, want mallory's EXECUTE refused:\n%s", code, tail(out, 3000))
	}
	// And one that inherits it from a group role: both named.
	execSQL(t, su, "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, bytea) FROM mallory",
		"CREATE ROLE emitters", "GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO emitters", "GRANT emitters TO mallory")
	code, out = runCmd(t, e, "check")
	if code == 0 || !strings.Contains(out, "role emitters may execute") || !strings.Contains(out, "role mallory may execute") {
		t.Fatalf("check: exit %d, want emitters and mallory refused:\n%s", code, tail(out, 3000))
	}
}

// TestEmitFunctionCannotBeBypassed: a walrelay_emit that would not reach
// walrelay, in the outbox's schema or another one that a writer has first
// on its search_path, or an overload that a call may resolve to, is
// refused by check and run, and so is one that lets a role without INSERT
// on the outbox write through its owner's rights. One in a schema on no
// one's search_path is left alone: whoever may create it there cannot
// keep walrelay from starting. (Before, only the function of the outbox's
// schema was read, and only its first overload.)
func TestEmitFunctionCannotBeBypassed(t *testing.T) {
	t.Parallel()
	pg, kc, _, su := bareSetup(t)
	e := baseEnv(pg, kc)
	mustRun(t, e, "migrate")
	const args = "(p_id uuid, p_aggregatetype text, p_aggregateid text, p_type text, p_payload jsonb)"
	execSQL(t, su, "CREATE SCHEMA app", "CREATE FUNCTION app.walrelay_emit"+args+` RETURNS pg_lsn LANGUAGE sql AS $$
    SELECT pg_logical_emit_message(true, 'elsewhere', json_build_object('id', p_id)::text) $$`)
	if code, out := runCmd(t, e, "check"); code != 0 {
		t.Fatalf("check with app.walrelay_emit on no one's search_path: exit %d\n%s", code, out)
	}
	for _, c := range []struct {
		name, create, drop string
	}{
		{"another schema", "CREATE ROLE writer; GRANT INSERT ON outbox TO writer; ALTER ROLE writer SET search_path = app, public", "DROP SCHEMA app CASCADE"},
		{"an overload", "CREATE FUNCTION public.walrelay_emit(p_id text, p_aggregatetype text, p_aggregateid text, p_type text, p_payload text)" + ` RETURNS pg_lsn LANGUAGE sql AS $$
    SELECT pg_logical_emit_message(true, 'elsewhere', p_payload) $$`, "DROP FUNCTION public.walrelay_emit(text, text, text, text, text)"},
		{"security definer", "ALTER FUNCTION public.walrelay_emit" + args + " SECURITY DEFINER", "ALTER FUNCTION public.walrelay_emit" + args + " SECURITY INVOKER"},
	} {
		execSQL(t, su, c.create)
		for _, cmd := range []string{"check", "run"} {
			code, out := runCmd(t, e, cmd)
			if code == 0 || !strings.Contains(out, "walrelay_emit") {
				t.Errorf("%s: %s: exit %d, want walrelay_emit refused:\n%s", c.name, cmd, code, tail(out, 2000))
			}
		}
		execSQL(t, su, c.drop)
	}
	if code, out := runCmd(t, e, "check"); code != 0 {
		t.Fatalf("check after the fixes: exit %d\n%s", code, out)
	}
}
