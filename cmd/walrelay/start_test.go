package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// slotExists reports whether the replication slot exists.
func slotExists(t *testing.T, conn *pgx.Conn, slot string) bool {
	t.Helper()
	var ok bool
	if err := conn.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", slot).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// closingListener accepts connections and closes them at once: something
// listening that does not speak Kafka (as a listener that wants TLS).
func closingListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return l.Addr().String()
}

// TestFailedStartLeavesNoSlot: a first start with a new slot name that fails
// on its Kafka check (a mistake in kafka.brokers: a host that does not
// resolve, a port that does not speak Kafka) fails at once, as before, and
// leaves no slot behind holding WAL.
func TestFailedStartLeavesNoSlot(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	for i, tc := range []struct{ name, brokers, want string }{
		{"unresolvable host", "nosuch-broker.invalid:9092", "kafka.brokers"},
		{"a port that does not speak Kafka", closingListener(t), "kafka.brokers"},
	} {
		slot := "wr9_" + string(rune('a'+i))
		began := time.Now()
		code, out := runCmd(t, e, "run", "--postgres.slot", slot, "--kafka.brokers", tc.brokers)
		took := time.Since(began)
		if code != 1 || !strings.Contains(lastLine(out), tc.want) {
			t.Fatalf("%s: exit %d after %s, last line %q: want exit 1 naming %s", tc.name, code, took, lastLine(out), tc.want)
		}
		if took > 30*time.Second {
			t.Fatalf("%s: exit after %s: want at once", tc.name, took)
		}
		if slotExists(t, conn, slot) || strings.Contains(out, "created replication slot") {
			t.Fatalf("%s: a start that failed left slot %s behind (it holds WAL until dropped):\n%s", tc.name, slot, out)
		}
		t.Logf("%s: exit %d after %s: %s", tc.name, code, took.Round(time.Millisecond), lastLine(out))
	}
}

// TestStartWaitsForKafka: a start while Kafka is down (connection refused)
// does not exit: it says so in the lines of an outage mid-run, walrelay
// status says so, /readyz is not ready; its new slot exists from the first
// wait, so rows committed while it waits (or is stopped) are not lost;
// SIGTERM stops it cleanly. Once Kafka answers, it streams every row.
func TestStartWaitsForKafka(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t) // nothing listens there yet: connections are refused
	pg, col := setupWith(t, []string{addr}, "")
	conn := connect(t, pg.DSN)
	admin := freeAddr(t)
	e := baseEnv(pg, &broker{addrs: []string{addr}}).with("WALRELAY_ADMIN_LISTEN", admin, "WALRELAY_POSTGRES_SLOT", "wr9")

	// Stopped while it waits.
	p := start(t, e, "run")
	p.waitLog(`msg="Kafka is not answering: walrelay holds its events and retries`, 30*time.Second)
	if !slotExists(t, conn, "wr9") {
		t.Fatal("no slot wr9 while walrelay waits for Kafka: rows committed during the wait are in no stream")
	}
	// Rows committed while it waits, and while it is stopped, are
	// published once Kafka answers.
	w := newWriter(3, 37)
	if err := w.write(t.Context(), conn, 10, 5); err != nil {
		t.Fatal(err)
	}
	p.signal(syscall.SIGTERM)
	if code := p.exit(20 * time.Second); code != 0 {
		t.Fatalf("SIGTERM while waiting for Kafka: exit %d:\n%s", code, p.out.String())
	}
	if err := w.write(t.Context(), conn, 10, 5); err != nil {
		t.Fatal(err)
	}

	// Kafka comes up while it waits.
	p = start(t, e, "run")
	p.waitLog(`msg="Kafka is not answering: walrelay holds its events and retries`, 30*time.Second)
	if code, body := httpStatus(t, "http://"+admin+"/readyz"); code != 503 || !strings.Contains(body, `"kafka_reachable":false`) {
		t.Fatalf("/readyz while waiting for Kafka: %d %s", code, body)
	}
	code, status := runCmd(t, e, "status")
	t.Logf("walrelay status while waiting for Kafka at start:\n%s", status)
	if code != 0 || !strings.Contains(status, "NOT ANSWERING since") || !strings.Contains(status, "Kafka: walrelay starts once it answers") {
		t.Fatalf("walrelay status while waiting for Kafka at start (exit %d) does not say so:\n%s", code, status)
	}
	kafkatest.Start(t, kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, addr) }))
	p.waitLog("msg=streaming", 60*time.Second)
	if !slotExists(t, conn, "wr9") {
		t.Fatal("streaming without slot wr9")
	}
	if code, body := httpStatus(t, "http://"+admin+"/readyz"); code != 200 {
		t.Fatalf("/readyz once streaming: %d %s", code, body)
	}
	if err := w.write(t.Context(), conn, 20, 5); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
}

// TestCheckWarnsOfInactiveSlots: a slot left behind (the slot of a first
// start that failed, before walrelay created slots last) keeps WAL with no
// one reading it; walrelay check names it, with the WAL it holds.
func TestCheckWarnsOfInactiveSlots(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	conn := connect(t, pg.DSN)
	for _, sql := range []string{
		"SELECT pg_create_logical_replication_slot('wr9', 'pgoutput')",
		"CREATE TABLE filler AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 20000) g",
	} {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	code, out := runCmd(t, baseEnv(pg, kc), "check")
	t.Logf("walrelay check:\n%s", out)
	if code != 0 {
		t.Fatalf("check: exit %d", code)
	}
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "WARN  inactive slot wr9") {
			line = l
		}
	}
	if !strings.Contains(line, "MiB of WAL") || !strings.Contains(line, "walrelay slot drop wr9") {
		t.Fatalf("check does not warn of slot wr9, inactive and holding WAL, with its size: %q", line)
	}
}

// TestStatusWithNothingRunning: walrelay status where no walrelay listens
// says so, and how to point it at the instance, instead of only
// "connection refused"; a server there that is not walrelay's admin
// listener is named as such.
func TestStatusWithNothingRunning(t *testing.T) {
	t.Parallel()
	other := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(other.Close)
	for _, tc := range []struct{ name, addr, want string }{
		{"nothing listening", freeAddr(t), "no walrelay answers at admin address"},
		{"another server", strings.TrimPrefix(other.URL, "http://"), "does not answer as a walrelay admin listener (404 Not Found"},
	} {
		for _, args := range [][]string{{"status"}, {"status", "--ready"}} {
			code, out := runCmd(t, env{"WALRELAY_ADMIN_LISTEN": tc.addr}, args...)
			if code == 0 || !strings.Contains(out, tc.want) || !strings.Contains(out, "--admin.listen") {
				t.Errorf("%s: walrelay %s: exit %d, want a line with %q and how to point it elsewhere:\n%s", tc.name, strings.Join(args, " "), code, tc.want, out)
			}
		}
	}
}

// TestPostgresRestartLogLine: a PostgreSQL restart under a running walrelay
// is logged in words (the server ended the stream: it shut down), not as a
// protocol message walrelay did not expect.
func TestPostgresRestartLogLine(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	needThrowaway(t, pg, "restarts the server")
	p := streaming(t, baseEnv(pg, kc))
	if err := pg.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	p.waitLog(`msg="the stream runs again"`, 60*time.Second)
	var lines []string
	for _, l := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") || strings.Contains(l, "reconnect") {
			lines = append(lines, l)
		}
	}
	t.Logf("walrelay's lines about the restart:\n%s", strings.Join(lines, "\n"))
	out := p.out.String()
	if strings.Contains(out, "unexpected message") || strings.Contains(out, "pgproto3") {
		t.Errorf("a PostgreSQL restart is logged as a protocol message walrelay did not expect:\n%s", strings.Join(lines, "\n"))
	}
	if !strings.Contains(out, "the server ended the replication stream") {
		t.Errorf("a PostgreSQL restart is not logged as the server ending the stream:\n%s", strings.Join(lines, "\n"))
	}
}

// TestPollStartWaitsForKafka: the poll source, started while its broker
// refuses connections, waits with the same lines and starts polling once
// Kafka answers.
func TestPollStartWaitsForKafka(t *testing.T) {
	t.Parallel()
	pg, kc, col := setupPoll(t)
	fk := kc.fake(t)
	fk.Stop() // Kafka stopped: connections refused
	p := start(t, pollEnv(pg, kc), "run")
	p.waitLog(`msg="Kafka is not answering: walrelay holds its events and retries`, 30*time.Second)
	fk.Up()
	p.waitLog(`msg="polling the outbox"`, 60*time.Second)
	conn := connect(t, pg.DSN)
	w := newWriter(3, 38)
	if err := w.write(t.Context(), conn, 20, 5); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
}

// TestCheckAdvisesPhysicalSlotsApart: review of #37 (trap 2's check). An
// inactive physical slot is a standby's (a replica restarting, a Patroni
// member down for maintenance): check does not tell to drop it with
// walrelay slot drop, which cannot (it knows logical slots only), but to
// check the standby, and how to drop it if that standby is gone.
func TestCheckAdvisesPhysicalSlotsApart(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	conn := connect(t, pg.DSN)
	execSQL(t, conn, "SELECT pg_create_physical_replication_slot('replica_b', true)")
	_, out := runCmd(t, baseEnv(pg, kc), "check")
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "inactive slot replica_b") {
			line = l
		}
	}
	if !strings.HasPrefix(line, "WARN") || strings.Contains(line, "walrelay slot drop replica_b") ||
		!strings.Contains(line, "check the standby") || !strings.Contains(line, "SELECT pg_drop_replication_slot('replica_b')") {
		t.Fatalf("check's line of an inactive physical slot: %q", line)
	}
	code, out := runCmd(t, baseEnv(pg, kc), "slot", "drop", "replica_b", "--yes")
	if code == 0 || !strings.Contains(out, "is a physical slot") {
		t.Fatalf("walrelay slot drop replica_b --yes (a physical slot): exit %d: %q", code, lastLine(out))
	}
}

// TestFailedStartAfterKafkaWaitSaysItsSlot: review of #37 (traps 2 and 3).
// A first start that finds Kafka down creates its slot, then waits; when
// Kafka's address then answers with something that fails the start (here
// a listener that closes at once, as a TLS listener does for a client
// without TLS), the slot stays: it may hold rows committed during the
// wait, in no other stream. The start says so loudly (ERROR, the slot's
// name, the WAL it holds, how to drop it), and check warns of walrelay's
// slot that nothing was ever streamed from, with its size, where it said
// "ok, walrelay's slot". Once walrelay has streamed it, check says ok.
func TestFailedStartAfterKafkaWaitSaysItsSlot(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	addr := freeAddr(t) // refused until the listener below
	e := baseEnv(pg, kc).with("WALRELAY_POSTGRES_SLOT", "wr_left")
	p := start(t, e.with("WALRELAY_KAFKA_BROKERS", addr), "run")
	p.waitLog("waiting for Kafka at start", 30*time.Second)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	code := p.exit(45 * time.Second)
	var said string
	for _, line := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(line, "level=ERROR") && strings.Contains(line, "created replication slot wr_left") {
			said = line
		}
	}
	if code == 0 || !slotExists(t, conn, "wr_left") || !strings.Contains(said, "of WAL") || !strings.Contains(said, "walrelay slot drop wr_left --yes") {
		t.Fatalf("the start failed (exit %d: %q) and left its new slot wr_left (exists: %v) without an ERROR line naming it, the WAL it holds and how to drop it: %q",
			code, lastLine(p.out.String()), slotExists(t, conn, "wr_left"), said)
	}
	inactive := func() string {
		_, out := runCmd(t, e, "check")
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "inactive slot wr_left") {
				return l
			}
		}
		return ""
	}
	if l := inactive(); !strings.HasPrefix(l, "WARN") || !strings.Contains(l, "of WAL") || !strings.Contains(l, "walrelay slot drop wr_left --yes") {
		t.Fatalf("check's line of walrelay's slot that a failed start left: %q", l)
	}
	p = streaming(t, e)
	w := newWriter(2, 5)
	if err := w.write(t.Context(), conn, 2, 2); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	p.signal(syscall.SIGTERM)
	if code := p.exit(time.Minute); code != 0 {
		t.Fatalf("run exited %d", code)
	}
	if l := inactive(); !strings.HasPrefix(l, "OK") {
		t.Fatalf("check's line of walrelay's slot once streamed: %q", l)
	}
}

// TestStoppedKafkaWaitNamesItsSlot: second review of #37 (review37b).
// Issue #37's trap 2 as reported (`walrelay run --postgres.slot wr9
// --kafka.brokers <a closed port>`): a closed port is "Kafka down", so the
// start creates the slot and waits for a broker that was only mistyped.
// Stopped (Ctrl-C, SIGTERM), it exits 0 and the new slot stays, holding
// WAL: a WARN line must name it (none did).
func TestStoppedKafkaWaitNamesItsSlot(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc).with("WALRELAY_POSTGRES_SLOT", "wr9")
	addr := freeAddr(t) // a mistyped port: refused
	p := start(t, e.with("WALRELAY_KAFKA_BROKERS", addr), "run")
	p.waitLog("waiting for Kafka at start", 30*time.Second)
	p.signal(syscall.SIGTERM)
	code := p.exit(30 * time.Second)
	var said, first string
	for _, line := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "created replication slot wr9") {
			said = line
		}
		if first == "" && strings.Contains(line, "waiting for Kafka at start") {
			first = line
		}
	}
	if !slotExists(t, conn, "wr9") {
		t.Fatal("no slot wr9: the test expects the start to have created it")
	}
	if said == "" || !strings.Contains(said, "walrelay slot drop wr9 --yes") {
		t.Fatalf("stopped while waiting for Kafka (exit %d, last line %q): the slot wr9 it created stays, and no WARN line names it", code, lastLine(p.out.String()))
	}
	if !strings.Contains(first, addr) {
		t.Fatalf("the line 'waiting for Kafka at start' does not name the brokers' address %s: %q", addr, first)
	}
}
