package main

import (
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/outbox"
)

// TestOthersSearchPathDoesNotBlockStart: a role without INSERT on the
// outbox sets its own search_path to a schema it owns and creates a
// walrelay_emit there; it writes no events, so check passes (issue 34
// review). A writer's search_path still counts (the control).
func TestOthersSearchPathDoesNotBlockStart(t *testing.T) {
	t.Parallel()
	pg, kc, _, su := bareSetup(t)
	if code, out := runCmd(t, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, out)
	}
	e := baseEnv(pg, kc)
	mallory := asRole(t, pg, su, "mallory", "CREATE SCHEMA tenant_m AUTHORIZATION mallory")
	execSQL(t, mallory, "ALTER ROLE mallory SET search_path = tenant_m, public",
		"CREATE FUNCTION tenant_m.walrelay_emit(p_id uuid, p_aggregatetype text, p_aggregateid text, p_type text, p_payload jsonb) RETURNS void LANGUAGE sql AS 'SELECT NULL'")
	if code, out := runCmd(t, e, "check"); code != 0 {
		t.Errorf("check fails (exit %d) because of a role without INSERT: %s", code, lastLine(out))
	}
	execSQL(t, su, "GRANT INSERT ON outbox TO mallory")
	if code, out := runCmd(t, e, "check"); code == 0 || !strings.Contains(out, "tenant_m.walrelay_emit") {
		t.Errorf("control: check passes a writer's search_path with its own walrelay_emit (exit %d): %s", code, lastLine(out))
	}
}

// TestOverloadOfOtherArityDoesNotBlockStart: an overload of walrelay_emit
// that a call with five arguments cannot resolve to (one argument) does
// not keep walrelay from starting; one that it can (five arguments, or
// with defaults covering the rest, or variadic) does.
func TestOverloadOfOtherArityDoesNotBlockStart(t *testing.T) {
	t.Parallel()
	pg, kc, _, su := bareSetup(t)
	if code, out := runCmd(t, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, out)
	}
	e := baseEnv(pg, kc)
	mallory := asRole(t, pg, su, "mallory", "GRANT CREATE ON SCHEMA public TO PUBLIC")
	execSQL(t, mallory, "CREATE FUNCTION public.walrelay_emit(x int) RETURNS void LANGUAGE sql AS 'SELECT NULL'",
		"CREATE FUNCTION public.walrelay_emit(a int, b int, c int, d int, e int, f int, g int) RETURNS void LANGUAGE sql AS 'SELECT NULL'")
	if code, out := runCmd(t, e, "check"); code != 0 {
		t.Errorf("check fails (exit %d) because of an overload no 5-argument call resolves to: %s", code, lastLine(out))
	}
	for _, f := range [][2]string{
		{"(a text, b text, c text, d text, e text)", "(text, text, text, text, text)"},
		{"(a text, b text, c text, d text, e text, f int DEFAULT 0)", "(text, text, text, text, text, int)"},
		{"(a text, VARIADIC b text[])", "(text, text[])"},
	} {
		execSQL(t, su, "CREATE FUNCTION public.walrelay_emit"+f[0]+" RETURNS void LANGUAGE sql AS 'SELECT NULL'")
		if code, out := runCmd(t, e, "check"); code == 0 || !strings.Contains(out, "overload") {
			t.Errorf("check passes an overload a 5-argument call may resolve to, %s (exit %d): %s", f[0], code, lastLine(out))
		}
		execSQL(t, su, "DROP FUNCTION public.walrelay_emit"+f[1])
	}
}

// TestDefinerWithSQLBodyRefused: a SECURITY DEFINER function with an
// SQL-standard body (BEGIN ATOMIC: prosrc is empty) that emits messages,
// executable by PUBLIC, is refused like one in plpgsql; mallory's call of
// it is not published.
func TestDefinerWithSQLBodyRefused(t *testing.T) {
	t.Parallel()
	pg, kc, _, su := bareSetup(t)
	e := baseEnv(pg, kc).with("WALRELAY_OUTBOX_MESSAGES", "true")
	if code, out := runCmd(t, e, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, out)
	}
	execSQL(t, su, `CREATE FUNCTION public.refund(p text) RETURNS pg_lsn LANGUAGE sql SECURITY DEFINER
		BEGIN ATOMIC SELECT pg_logical_emit_message(true, 'walrelay', p); END`)
	if code, out := runCmd(t, e, "check"); code == 0 || !strings.Contains(out, "refund") {
		t.Errorf("check passes a SECURITY DEFINER function with an SQL-standard body that emits messages, executable by PUBLIC (exit %d): %s", code, lastLine(out))
	}
	p := start(t, e, "run")
	select {
	case <-p.done:
		if out := p.out.String(); !strings.Contains(out, "refund") {
			t.Errorf("run exits without naming the function: %s", lastLine(out))
		}
	case <-time.After(20 * time.Second):
		t.Errorf("run starts with public.refund executable by PUBLIC")
	}
	_ = outbox.NewID
}
