package main

import (
	"context"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
)

// TestSurvivesSIGKILL kills walrelay at random moments mid-stream, three
// times, while rows are written without pause, and then lets it finish:
// every committed id arrives.
func TestSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	killThreeTimes(t, pg, baseEnv(pg, kc), col, conn, 3)
	want := committedIDs(t, conn)
	c := waitAll(t, col, want, 2*time.Minute)
	t.Logf("after 3 SIGKILLs: rows committed %d, %s", len(want), c)
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
}

// writeThenSnapshot writes rows, waits for them on the topics, and copies
// the server's files while it is stopped; the server runs again after.
func writeThenSnapshot(t *testing.T, pg *pgtest.Server, col *kafkatest.Collector, w *writer, rows int) (restore func(context.Context) error) {
	t.Helper()
	ctx := t.Context()
	if err := w.write(ctx, connect(t, pg.DSN), rows, 10); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	restore, err := pg.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	return restore
}

// killThreeTimes runs walrelay of e and SIGKILLs it three times at random
// moments (seeded) while rows are written without pause, then starts it
// once more and stops writing.
func killThreeTimes(t *testing.T, pg *pgtest.Server, e env, col *kafkatest.Collector, conn *pgx.Conn, seed uint64) {
	t.Helper()
	w := newWriter(50, 2)
	w.bytes = 200
	stop := w.keepWriting(t.Context(), pg.DSN)
	rng := rand.New(rand.NewPCG(seed, seed))
	for i := range 3 {
		p := streaming(t, e)
		time.Sleep(time.Duration(200+rng.IntN(2300)) * time.Millisecond)
		p.kill()
		t.Logf("kill %d: %d rows written, %d records so far, slot confirmed at %s", i+1, len(w.written()), len(col.Records()), slotConfirmed(t, conn, "walrelay"))
	}
	streaming(t, e)
	if n := stop(); n != 0 {
		t.Fatalf("%d writes failed", n)
	}
}

// TestCleanStopPublishesNothingTwice stops walrelay with SIGTERM mid-stream
// and starts it again: every event arrives exactly once.
func TestCleanStopPublishesNothingTwice(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	w := newWriter(20, 4)
	w.bytes = 100
	writeErr := make(chan error, 1)
	go func() { writeErr <- w.write(context.Background(), conn, 20000, 50) }()
	e := baseEnv(pg, kc)
	for range 2 {
		p := streaming(t, e)
		time.Sleep(700 * time.Millisecond)
		p.signal(syscall.SIGTERM)
		if code := p.exit(40 * time.Second); code != 0 {
			t.Fatalf("SIGTERM: exit %d", code)
		}
		if !strings.Contains(p.out.String(), "msg=stopped") {
			t.Fatalf("no clean stop logged")
		}
	}
	streaming(t, e)
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("after two SIGTERM restarts: %s", c)
	if c.duplicates != 0 || c.orderViolations != 0 {
		t.Fatalf("a clean stop published events twice: %s", c)
	}
}

// waitConfirmedPast waits until the slot confirmed at least lsn: every
// event before it is acknowledged, and the position reached the server.
func waitConfirmedPast(t *testing.T, conn *pgx.Conn, lsn string) {
	t.Helper()
	want, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, _ := pglogrepl.ParseLSN(slotConfirmed(t, conn, "walrelay"))
		if got >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot confirmed %s, want at least %s", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestPostgresRestart restarts PostgreSQL mid-stream: walrelay reconnects
// and resumes with nothing lost. PostgreSQL 15 does not save a slot's
// confirmed position at shutdown, so the restarted slot is behind what
// walrelay confirmed; walrelay resumes from its own position (same server,
// same timeline) instead of taking every event since the slot's last save
// again.
func TestPostgresRestart(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	needThrowaway(t, pg, "restarts the server")
	conn := connect(t, pg.DSN)
	p := streaming(t, baseEnv(pg, kc))
	w := newWriter(30, 6)
	if err := w.write(t.Context(), conn, 3000, 30); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	if err := pg.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	conn2 := connect(t, pg.DSN)
	if err := w.write(t.Context(), conn2, 3000, 30); err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("after a PostgreSQL restart: %s", c)
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
	// Every event before the restart was acknowledged before it, so none
	// should come again; a few would be a late ack, 3,000 the slot's
	// position.
	if c.duplicates > 300 {
		t.Fatalf("the restart resent events confirmed before it: %s", c)
	}
	if !strings.Contains(p.out.String(), "reconnecting") {
		t.Fatalf("walrelay did not log a reconnect")
	}
	p.waitLog(`msg="the stream runs again"`, 30*time.Second)
}

// TestRestoredServerResumesFromItsSlot: the server's data directory is put
// back to a copy taken earlier (a disk snapshot restored, say) while
// walrelay runs. Same system identifier, same timeline, but the WAL that
// walrelay confirmed positions in is gone, and new transactions reuse those
// positions. walrelay must resume from the restored slot's position, not
// from its own (which would skip the new transactions): every row written
// after the restore arrives.
func TestRestoredServerResumesFromItsSlot(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, col := setup(t)
	needThrowaway(t, pg, "restores the server's files")
	ctx := t.Context()
	p := streaming(t, baseEnv(pg, kc))
	w := newWriter(30, 7)
	restore := writeThenSnapshot(t, pg, col, w, 1000)
	// WAL that will be gone: walrelay confirms positions past the copy.
	conn := connect(t, pg.DSN)
	if err := w.write(ctx, conn, 3000, 10); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	confirmedBefore := slotConfirmed(t, conn, "walrelay")
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := restore(ctx); err != nil {
		t.Fatal(err)
	}
	// walrelay reconnects before the restored server writes past its
	// position (see docs/guarantees.md, Limits, for the case where it does not).
	sessions := strings.Count(p.out.String(), "msg=streaming")
	if err := pg.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); strings.Count(p.out.String(), "msg=streaming") == sessions; {
		if time.Now().After(deadline) {
			t.Fatal("walrelay did not stream from the restored server within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn = connect(t, pg.DSN)
	if err := w.write(ctx, conn, 300, 10); err != nil {
		t.Fatal(err)
	}
	var restoredEnd string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&restoredEnd); err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, w.written(), time.Minute)
	t.Logf("confirmed %s before the restore; the restored server's WAL ends at %s after 300 new rows: %s", confirmedBefore, restoredEnd, c)
	if !strings.Contains(p.out.String(), "WAL history is not the one") {
		t.Fatalf("walrelay did not say that it resumed from the slot's position")
	}
}

// TestSecondInstanceWaitsForTheSlot: a second walrelay on the same slot
// waits, naming the pid that holds it once (not at every try: it tries
// every second; before, it logged every second), and takes over when the
// first dies.
func TestSecondInstanceWaitsForTheSlot(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	first := streaming(t, e)
	adminAddr := freeAddr(t)
	second := start(t, e.with("WALRELAY_ADMIN_LISTEN", adminAddr), "run")
	second.waitLog("slot is active in another process", 30*time.Second)
	// It tries every second, and says so once, not once a try.
	time.Sleep(4 * time.Second)
	if n := strings.Count(second.out.String(), "slot is active in another process"); n != 1 {
		t.Fatalf("the waiting instance logged its wait %d times in 4 s, want once:\n%s", n, tail(second.out.String(), 2000))
	}
	// Not ready as the streaming instance; ready as a standby (the
	// readiness Kubernetes is given).
	if code, body := httpStatus(t, "http://"+adminAddr+"/readyz"); code != 503 || !strings.Contains(body, `"state":"waiting_for_slot"`) {
		t.Fatalf("/readyz of the waiting instance: %d %s", code, body)
	}
	if code, body := httpStatus(t, "http://"+adminAddr+"/readyz?standby=1"); code != 200 {
		t.Fatalf("/readyz?standby=1 of the waiting instance: %d %s", code, body)
	}
	first.kill()
	killed := time.Now()
	second.waitLog("msg=streaming", 30*time.Second)
	takeover := time.Since(killed)
	// No bound but waitLog's: the standby asks every second at most, and
	// a loaded machine may take longer; the figure is logged.
	t.Logf("the standby streamed %s after the first instance was killed", takeover.Round(10*time.Millisecond))
	if code, body := httpStatus(t, "http://"+adminAddr+"/readyz"); code != 200 {
		t.Fatalf("/readyz of the instance that took over: %d %s", code, body)
	}
	w := newWriter(5, 7)
	if err := w.write(t.Context(), conn, 100, 10); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
}

// TestIdleOutboxDoesNotHoldWAL: with the outbox idle and another table of
// the same database busy, the keepalive advance moves the slot along with the
// WAL while it is written, and to the end after, so the disk does not fill
// with WAL the slot no longer needs. The lag while writing is about the WAL
// rate times the status interval (1 s here), so the test asserts that the
// slot follows, not a lag figure that depends on how fast this machine
// writes (100 to 320 MiB/s here): the slot must pass 100 MiB of another
// table's WAL before 1 GiB is written.
func TestIdleOutboxDoesNotHoldWAL(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, _ := setup(t)
	conn := connect(t, pg.DSN)
	streaming(t, baseEnv(pg, kc))
	ctx := t.Context()
	if _, err := conn.Exec(ctx, "CREATE TABLE busy (id bigserial PRIMARY KEY, pad text)"); err != nil {
		t.Fatal(err)
	}
	// position returns the server's WAL position and the slot's confirmed
	// one, in bytes.
	position := func() (current, confirmed int64) {
		if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0', confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = 'walrelay'`).Scan(&current, &confirmed); err != nil {
			t.Fatal(err)
		}
		return current, confirmed
	}
	start, _ := position()
	began := time.Now()
	var worst int64
	for {
		if _, err := conn.Exec(ctx, "INSERT INTO busy (pad) SELECT repeat('z', 1000) FROM generate_series(1, 1000)"); err != nil {
			t.Fatal(err)
		}
		current, confirmed := position()
		worst = max(worst, current-confirmed)
		if confirmed-start >= 100<<20 {
			t.Logf("the slot followed 100 MiB of another table's WAL while %d MiB were written at %.0f MiB/s; lag at most %.1f MiB",
				(current-start)>>20, float64(current-start)/(1<<20)/time.Since(began).Seconds(), float64(worst)/(1<<20))
			break
		}
		if current-start >= 1<<30 {
			t.Fatalf("the slot moved %d MiB while %d MiB of WAL went to another table", (confirmed-start)>>20, (current-start)>>20)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		current, confirmed := position()
		if lag := current - confirmed; lag < 1<<20 {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("the slot still lags %d bytes behind an idle outbox", lag)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestHeartbeatIsWrittenAndNotPublished: with heartbeat.interval set,
// walrelay writes heartbeat messages into the WAL, reads them back through
// the slot and publishes none of them. (On this server the keepalive advance
// alone keeps the slot moving when only another database writes, as
// TestIdleOutboxDoesNotHoldWAL shows for another table; the heartbeat is for
// setups where keepalives do not carry the WAL end forward, and costs one tiny
// WAL record per interval.)
func TestHeartbeatIsWrittenAndNotPublished(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	admin := freeAddr(t)
	streaming(t, baseEnv(pg, kc).with("WALRELAY_HEARTBEAT_INTERVAL", "100ms", "WALRELAY_ADMIN_LISTEN", admin))
	deadline := time.Now().Add(20 * time.Second)
	for {
		beats, _ := metricValue(httpGet(t, "http://"+admin+"/metrics"), `walrelay_changes_ignored_total{kind="heartbeat"}`)
		if beats >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v heartbeats came back through the slot in 20 s, want at least 5", beats)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := len(col.Records()); n != 0 {
		t.Fatalf("%d records published from heartbeats", n)
	}
}

// TestLostSlotStopsWithAnExplanation: a slot the server invalidated
// (wal_status lost) stops walrelay with what happened and how to recover.
func TestLostSlotStopsWithAnExplanation(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	needThrowaway(t, pg, "changes server settings")
	conn := connect(t, pg.DSN)
	ctx := t.Context()
	for _, sql := range []string{
		"ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "ALTER SYSTEM SET max_wal_size = '32MB'", "ALTER SYSTEM SET min_wal_size = '32MB'",
		"SELECT pg_reload_conf()",
		"CREATE TABLE busy AS SELECT repeat('z', 1000) AS pad FROM generate_series(1, 80000)",
		"SELECT pg_switch_wal()", "CHECKPOINT",
		"INSERT INTO busy SELECT repeat('y', 1000) FROM generate_series(1, 80000)",
		"SELECT pg_switch_wal()", "CHECKPOINT",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	var status string
	if err := conn.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'walrelay'").Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "lost" {
		t.Fatalf("could not invalidate the slot for the test: wal_status %s", status)
	}
	code, out := runCmd(t, baseEnv(pg, kc), "run")
	if code == 0 || !strings.Contains(out, "was invalidated (wal_status lost)") || !strings.Contains(out, "recreate the slot") {
		t.Fatalf("exit %d, want the invalidated-slot explanation:\n%s", code, tail(out, 2000))
	}
}

// TestReplicationConnectionCut cuts walrelay's connections to PostgreSQL
// (through a TCP proxy) twice mid-stream: it reconnects and nothing is lost.
func TestReplicationConnectionCut(t *testing.T) {
	long(t) // 20,000 rows through two cuts; TestBlackHoledServer and TestPostgresRestart lose the session in the default suite
	t.Parallel()
	pg, kc, col := setup(t)
	px, dsn := pgProxy(t, pg)
	conn := connect(t, pg.DSN)
	p := streaming(t, baseEnv(pg, kc).with("WALRELAY_POSTGRES_DSN", dsn))
	w := newWriter(30, 10)
	writeErr := make(chan error, 1)
	go func() { writeErr <- w.write(context.Background(), conn, 20000, 20) }()
	for range 2 {
		time.Sleep(700 * time.Millisecond)
		px.Cut()
	}
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("after two cuts of the replication connection: %s", c)
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
	if !strings.Contains(p.out.String(), "reconnecting") {
		t.Fatal("walrelay did not log a reconnect")
	}
}

// TestPausedPastSenderTimeout stops walrelay with SIGSTOP for longer than
// wal_sender_timeout: the server ends the session; after SIGCONT walrelay
// reconnects and nothing is lost.
func TestPausedPastSenderTimeout(t *testing.T) {
	long(t) // waits out wal_sender_timeout
	t.Parallel()
	pg, kc, col := setup(t)
	needThrowaway(t, pg, "changes server settings")
	conn := connect(t, pg.DSN)
	ctx := t.Context()
	for _, sql := range []string{"ALTER SYSTEM SET wal_sender_timeout = '2s'", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	p := streaming(t, baseEnv(pg, kc))
	w := newWriter(30, 11)
	if err := w.write(ctx, conn, 2000, 20); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	p.signal(syscall.SIGSTOP)
	if err := w.write(ctx, conn, 2000, 20); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // past wal_sender_timeout: the server gives up on the session
	var senders int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication").Scan(&senders); err != nil {
		t.Fatal(err)
	}
	p.signal(syscall.SIGCONT)
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("after a pause past wal_sender_timeout (walsenders left during it: %d): %s", senders, c)
	if senders != 0 {
		t.Fatalf("the server kept the paused session (%d walsenders): the pause did not pass wal_sender_timeout", senders)
	}
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
}

// TestKilledBetweenAckAndConfirm kills walrelay (a build with the
// faultinject hook) right after Kafka acknowledged an event and before the
// checkpoint heard of it, three times: the events Kafka has but PostgreSQL
// was never told of come again, and nothing is lost.
func TestKilledBetweenAckAndConfirm(t *testing.T) {
	long(t)
	t.Parallel()
	bin, err := faultBin()
	if err != nil {
		t.Fatal(err)
	}
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	w := newWriter(20, 13)
	if err := w.write(t.Context(), conn, 6000, 20); err != nil {
		t.Fatal(err)
	}
	for i, after := range []string{"500", "1700", "2900"} {
		p := startBin(t, bin, baseEnv(pg, kc).with("WALRELAY_FAULT_KILL_AFTER_ACKS", after), "run")
		code := p.exit(60 * time.Second)
		if code != -1 { // killed by a signal
			t.Fatalf("run %d: exit %d, want killed by SIGKILL:\n%s", i+1, code, tail(p.out.String(), 2000))
		}
		t.Logf("killed after ack %s; slot at %s", after, slotConfirmed(t, conn, "walrelay"))
	}
	streaming(t, baseEnv(pg, kc))
	c := waitAll(t, col, w.written(), 2*time.Minute)
	t.Logf("after three kills between ack and confirm: %s", c)
	if c.duplicates == 0 {
		t.Fatalf("no duplicates: the kills did not land between an ack and its confirmation")
	}
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
}
