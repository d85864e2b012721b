package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/outbox"
)

// runExited starts walrelay run with e and waits up to 20 s for it to
// exit (a refusal to start): it returns the process and whether it
// exited.
func runExited(t *testing.T, e env) (*proc, bool) {
	t.Helper()
	p := start(t, e, "run")
	select {
	case <-p.done:
		return p, true
	case <-time.After(20 * time.Second):
		return p, false
	}
}

// TestOthersSearchPathDoesNotBlockStart: a role without INSERT on the
// outbox sets its own search_path to a schema it owns and creates a
// walrelay_emit there; it writes no events, so check passes (issue 34
// review). A writer's search_path still counts (the control).
func TestOthersSearchPathDoesNotBlockStart(t *testing.T) {
	t.Parallel()
	pg, kc, _, su := bareSetup(t)
	mustRun(t, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate")
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
	mustRun(t, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate")
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
	mustRun(t, e, "migrate")
	execSQL(t, su, `CREATE FUNCTION public.refund(p text) RETURNS pg_lsn LANGUAGE sql SECURITY DEFINER
		BEGIN ATOMIC SELECT pg_logical_emit_message(true, 'walrelay', p); END`)
	if code, out := runCmd(t, e, "check"); code == 0 || !strings.Contains(out, "refund") {
		t.Errorf("check passes a SECURITY DEFINER function with an SQL-standard body that emits messages, executable by PUBLIC (exit %d): %s", code, lastLine(out))
	}
	if p, exited := runExited(t, e); !exited {
		t.Errorf("run starts with public.refund executable by PUBLIC")
	} else if out := p.out.String(); !strings.Contains(out, "refund") {
		t.Errorf("run exits without naming the function: %s", lastLine(out))
	}
	_ = outbox.NewID
}

// TestMessagesBeforePrivilegesDeadLettered: while PUBLIC may execute
// pg_logical_emit_message (the default, walrelay running with the message
// source off), a role without INSERT emits a forged event that commits
// before walrelay last confirmed nothing of it, and another in a
// transaction it keeps open. The operator turns outbox.messages on as
// documented (migrate as superuser, restart); both forged events are
// dead-lettered as message_before_privileges, not published; an event
// written with walrelay_emit after the migrate is published. Without the
// horizon migrate records, run refuses to start, naming walrelay migrate.
func TestMessagesBeforePrivilegesDeadLettered(t *testing.T) {
	t.Parallel()
	pg, kc, col, su := bareSetup(t)
	mustRun(t, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate")
	e := baseEnv(pg, kc)
	p := streaming(t, e)
	p.signal(15)
	p.exit(time.Minute)
	mallory := asRole(t, pg, su, "mallory")
	committed, open := outbox.NewID(), outbox.NewID()
	execSQL(t, mallory, "SELECT pg_logical_emit_message(true, 'walrelay', '"+forgedEvent(committed)+"')")
	tx, err := mallory.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), "SELECT pg_logical_emit_message(true, 'walrelay', '"+forgedEvent(open)+"')"); err != nil {
		t.Fatal(err)
	}
	// A statement running across the REVOKE: its EXECUTE was checked
	// when it started, and it emits (and gets its xid) after.
	slow := outbox.NewID()
	mallory2 := asRole(t, pg, su, "mallory2")
	slowDone := make(chan error, 1)
	go func() {
		_, err := mallory2.Exec(context.Background(), "SELECT pg_logical_emit_message(true, 'walrelay', x) FROM (SELECT pg_sleep(3)::text || '"+forgedEvent(slow)+"' AS x) s")
		slowDone <- err
	}()
	time.Sleep(500 * time.Millisecond)
	em := e.with("WALRELAY_OUTBOX_MESSAGES", "true")
	if code, out := runCmd(t, em, "migrate"); code != 0 {
		t.Fatalf("migrate with outbox.messages: exit %d\n%s", code, out)
	}
	if err := <-slowDone; err != nil {
		t.Fatalf("the statement running across the REVOKE: %v", err)
	}
	p = streaming(t, em)
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	real := outbox.NewID()
	execSQL(t, su, "SELECT walrelay_emit('"+real+"', 'payments', 'acct-1', 'Captured', '{}')")
	waitAll(t, col, []string{real}, time.Minute)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var dead []string
		for _, r := range col.Records() {
			if strings.Contains(string(r.Value), "1000000") && r.Topic != kc.dlq() {
				t.Fatalf("mallory's message, emitted before the REVOKE, was published: topic %s value %s", r.Topic, r.Value)
			}
			if r.Topic == kc.dlq() && string(kafkatest.Header(r, "walrelay.reason")) == "message_before_privileges" {
				dead = append(dead, string(kafkatest.Header(r, "id")))
			}
		}
		if slices.Contains(dead, committed) && slices.Contains(dead, open) && slices.Contains(dead, slow) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the forged messages were not dead-lettered as message_before_privileges: %v", dead)
		}
		time.Sleep(200 * time.Millisecond)
	}
	p.running()
	p.signal(15)
	p.exit(time.Minute)
	// Privileges right, but no horizon recorded (fixed by hand, say).
	execSQL(t, su, "COMMENT ON FUNCTION walrelay_emit(uuid, text, text, text, jsonb) IS NULL")
	if p, exited := runExited(t, em); !exited {
		t.Errorf("run starts without the horizon migrate records")
	} else if out := p.out.String(); !strings.Contains(out, "walrelay migrate") {
		t.Errorf("run exits without naming walrelay migrate: %s", lastLine(out))
	}
}

// TestPartitionPrivilegeRefused: a role given INSERT on each new table of
// the schema (ALTER DEFAULT PRIVILEGES) holds it on a partition of the
// outbox, not on the outbox: its rows in the partition would be published
// as the outbox's. check fails and run refuses to start, naming the
// partition and the REVOKE.
func TestPartitionPrivilegeRefused(t *testing.T) {
	t.Parallel()
	pg, kc, _, su := bareSetup(t)
	asRole(t, pg, su, "etl", "ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT ON TABLES TO etl")
	execSQL(t, su,
		`CREATE TABLE outbox (id uuid, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL,
			payload jsonb, created_at timestamptz NOT NULL, PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`,
		"REVOKE ALL ON outbox FROM etl",
		`CREATE TABLE outbox_2026_01 PARTITION OF outbox FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')`)
	e := baseEnv(pg, kc)
	if code, out := runCmd(t, e, "check"); code == 0 || !strings.Contains(out, "REVOKE INSERT ON outbox_2026_01 FROM etl") {
		t.Errorf("check passes (exit %d) with etl's INSERT on a partition of the outbox: %s", code, lastLine(out))
	}
	if p, exited := runExited(t, e); !exited {
		t.Errorf("run starts with etl's INSERT on a partition of the outbox")
	} else if out := p.out.String(); !strings.Contains(out, "outbox_2026_01") {
		t.Errorf("run exits without naming the partition: %s", lastLine(out))
	}
	if code, out := runCmd(t, pollEnv(pg, kc), "check"); code == 0 || !strings.Contains(out, "REVOKE INSERT ON outbox_2026_01 FROM etl") {
		t.Errorf("check with source poll passes (exit %d) with etl's INSERT on a partition of the outbox: %s", code, lastLine(out))
	}
	execSQL(t, su, "REVOKE INSERT ON outbox_2026_01 FROM etl")
	if code, out := runCmd(t, e, "check"); strings.Contains(out, "partitions") && code != 0 {
		t.Errorf("check still fails after the REVOKE: %s", lastLine(out))
	}
}

// TestMessagesBypassTableRulesRefused: with outbox.messages on, a message
// writes no row, so row-level security and CHECK constraints on the outbox
// would not confine it: check fails and run refuses to start; a BEFORE
// INSERT trigger is a warning.
func TestMessagesBypassTableRulesRefused(t *testing.T) {
	t.Parallel()
	pg, kc, _, su := bareSetup(t)
	e := baseEnv(pg, kc).with("WALRELAY_OUTBOX_MESSAGES", "true")
	mustRun(t, e, "migrate")
	execSQL(t, su, "CREATE FUNCTION public.stamp() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'",
		"CREATE TRIGGER stamp BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION public.stamp()")
	if code, out := runCmd(t, e, "check"); code != 0 || !strings.Contains(out, "BEFORE INSERT trigger stamp") {
		t.Errorf("check with a BEFORE INSERT trigger: exit %d, want 0 and a warning naming it: %s", code, tail(out, 1500))
	}
	for _, c := range []struct{ name, set, fix, want string }{
		{"row security", "ALTER TABLE outbox ENABLE ROW LEVEL SECURITY", "ALTER TABLE outbox DISABLE ROW LEVEL SECURITY", "row-level security"},
		{"check", "ALTER TABLE outbox ADD CONSTRAINT tenant CHECK (aggregatetype <> 'payments')", "ALTER TABLE outbox DROP CONSTRAINT tenant", "CHECK constraint tenant"},
	} {
		execSQL(t, su, c.set)
		if code, out := runCmd(t, e, "check"); code == 0 || !strings.Contains(out, c.want) {
			t.Errorf("%s: check passes (exit %d) though messages would bypass it: %s", c.name, code, lastLine(out))
		}
		if p, exited := runExited(t, e); !exited {
			t.Errorf("%s: run starts though messages would bypass it", c.name)
			p.signal(15)
			p.exit(time.Minute)
		} else if out := p.out.String(); !strings.Contains(out, c.want) {
			t.Errorf("%s: run exits without naming it: %s", c.name, lastLine(out))
		}
		execSQL(t, su, c.fix)
	}
}
