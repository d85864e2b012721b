package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
)

// The bin directories of a PostgreSQL major upgrade: whole installations
// (pg_upgrade, pg_controldata, pg_resetwal, pg_dump, psql beside the
// server), as `.ci/postgres 17 full` and `.ci/postgres 18 full` print them.
// TestPostgresMajorUpgrade runs only when both are set (.ci/run sets them).
const (
	EnvUpgradeFrom = "WALRELAY_TEST_PG_UPGRADE_FROM"
	EnvUpgradeTo   = "WALRELAY_TEST_PG_UPGRADE_TO"
)

// TestPostgresMajorUpgrade upgrades PostgreSQL (17 to 18 in .ci/run) under
// a running outbox with pg_upgrade, following docs/upgrading.md: rows are
// written while walrelay streams; walrelay is stopped (SIGTERM) and more
// rows are written to the old cluster before its stop; pg_upgrade refuses
// the slot, which has not consumed them (its check names the slot).
// walrelay runs again until the outbox is idle and confirmed, and stops; a
// write to another table of the database is refused as well, until
// walrelay ran again. Then pg_upgrade carries the slot over; rows are
// written to the upgraded cluster before and while walrelay runs on the
// upgraded slot. Every row is on the topics at least once, in order per
// aggregate; in exactly-once mode once, after a takeover of the old system
// identifier's transactional id, which walrelay names (and after a SIGKILL
// with the takeover still set, and a start without it). From PostgreSQL 15
// or 16, whose pg_upgrade carries no slot, upgradeWithoutSlots.
func TestPostgresMajorUpgrade(t *testing.T) {
	from, to := os.Getenv(EnvUpgradeFrom), os.Getenv(EnvUpgradeTo)
	if from == "" || to == "" {
		t.Skip(EnvUpgradeFrom + " and " + EnvUpgradeTo + " (bin directories of whole PostgreSQL installations, .ci/postgres 17 full and 18 full) run it (.ci/run does)")
	}
	for _, exactlyOnce := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly_once=%v", exactlyOnce), func(t *testing.T) {
			t.Parallel()
			testPostgresMajorUpgrade(t, from, to, exactlyOnce)
		})
	}
}

func testPostgresMajorUpgrade(t *testing.T, from, to string, exactlyOnce bool) {
	began := time.Now()
	kc := newBroker(t)
	pg := pgtest.StartBin(t, from)
	if p := start(t, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate"); p.exit(60*time.Second) != 0 {
		t.Fatalf("migrate:\n%s", p.out.String())
	}
	var opts []kgo.Opt
	e := baseEnv(pg, kc)
	if exactlyOnce {
		e = eosEnv(pg, kc)
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	q := regexp.QuoteMeta(kc.prefix)
	col, err := kafkatest.Collect(kc.Addrs(), q+`outbox\.event\..*|`+q+`walrelay\.dlq`, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(col.Close)
	oldMajor, err := pg.Version(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	sysID := func() string {
		return texts(t, connect(t, pg.DSN), "SELECT system_identifier::text FROM pg_control_system()")[0]
	}
	oldSysID := sysID()
	w := newWriter(20, 37)
	if oldMajor < 17 {
		if exactlyOnce {
			t.Skipf("from PostgreSQL %d the slot is not carried: the at-least-once case shows its procedure", oldMajor)
		}
		upgradeWithoutSlots(t, pg, to, e, col, w)
		return
	}
	conn := connect(t, pg.DSN)

	// Before: rows written while walrelay streams.
	p := streaming(t, e)
	if err := w.write(t.Context(), conn, 500, 10); err != nil {
		t.Fatal(err)
	}
	stopCleanly(t, p)
	// While walrelay is stopped: rows the slot has not consumed.
	if err := w.write(t.Context(), conn, 200, 10); err != nil {
		t.Fatal(err)
	}
	conn.Close(context.Background())
	report, err := pg.Upgrade(t.Context(), to, pgtest.UpgradeOptions{Check: true})
	if err == nil {
		t.Fatalf("pg_upgrade --check passed a slot that has not consumed 200 rows:\n%s", report)
	}
	if !strings.Contains(report, `"walrelay"`) || !strings.Contains(report, "has not consumed") {
		t.Fatalf("pg_upgrade refused, but not for the slot:\n%s", report)
	}
	t.Logf("pg_upgrade --check with the slot behind refuses: %s", lineWith(report, "has not consumed"))

	// The procedure: walrelay runs until the outbox is idle and every row
	// is confirmed, then stops cleanly; the server stops after it.
	if err := pg.StartServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	conn = connect(t, pg.DSN)
	p = streaming(t, e)
	waitAll(t, col, w.written(), time.Minute)
	// Step 2 of the procedure: `walrelay lsn show` says the slot is 0
	// bytes behind (an idle outbox's keepalives are confirmed too).
	t.Logf("walrelay lsn show, caught up: %s", waitLSNShowCaughtUp(t, e))
	stopCleanly(t, p)
	// A write to another table of the database after walrelay's stop:
	// pg_upgrade decodes every change, not only the publication's.
	if _, err := conn.Exec(t.Context(), "CREATE TABLE orders (id int PRIMARY KEY); INSERT INTO orders VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(context.Background())
	report, err = pg.Upgrade(t.Context(), to, pgtest.UpgradeOptions{Check: true})
	if err == nil || !strings.Contains(report, "has not consumed") {
		t.Fatalf("pg_upgrade --check after a write to another table than the outbox: %v\n%s", err, report)
	}
	t.Logf("pg_upgrade --check after a write to another table once walrelay stopped refuses too: %s", lineWith(report, "has not consumed"))
	// walrelay runs again: with nothing to publish it confirms the
	// server's WAL position (keepalives), and stops.
	if err := pg.StartServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	p = streaming(t, e)
	waitLSNShowCaughtUp(t, e)
	stopCleanly(t, p)
	up := time.Now()
	out, err := pg.Upgrade(t.Context(), to, pgtest.UpgradeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	newMajor, err := pg.Version(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pg_upgrade %d -> %d took %s: %s; system identifier %s, was %s", oldMajor, newMajor, time.Since(up).Round(time.Millisecond), lineWith(out, "Upgrade Complete"), sysID(), oldSysID)
	if newMajor <= oldMajor {
		t.Fatalf("the server is PostgreSQL %d after the upgrade from %d", newMajor, oldMajor)
	}
	conn = connect(t, pg.DSN)
	var slotType string
	if err := conn.QueryRow(t.Context(), "SELECT slot_type FROM pg_replication_slots WHERE slot_name = 'walrelay'").Scan(&slotType); err != nil {
		t.Fatalf("the slot after pg_upgrade to %d: %v", newMajor, err)
	}

	// After: rows written before walrelay starts on the upgraded slot, and
	// while it streams.
	if err := w.write(t.Context(), conn, 200, 10); err != nil {
		t.Fatal(err)
	}
	if exactlyOnce {
		// pg_upgrade gives the cluster a new system identifier: the
		// position on the offsets topic is of the old one, committed under
		// the old transactional id. walrelay refuses it and names the
		// takeover; with it, it fences the old id and takes the position
		// over.
		p = start(t, e, "run")
		if code := p.exit(60 * time.Second); code != 1 {
			t.Fatalf("exactly-once on the upgraded cluster without a takeover: exit %d:\n%s", code, tail(p.out.String(), 3000))
		}
		oldID := "walrelay-" + oldSysID + "-postgres-walrelay"
		if last := lastLine(p.out.String()); !strings.Contains(last, "kafka.transactional_id_takeover: "+oldID) {
			t.Fatalf("the refusal does not name the takeover of %s: %s", oldID, last)
		}
		t.Logf("without a takeover: %s", lastLine(p.out.String()))
		e = e.with("WALRELAY_KAFKA_TRANSACTIONAL_ID_TAKEOVER", oldID)
	}
	p = streaming(t, e)
	if err := w.write(t.Context(), conn, 300, 10); err != nil {
		t.Fatal(err)
	}
	want := committedIDs(t, conn)
	if len(want) != len(w.written()) {
		t.Fatalf("the outbox holds %d rows after the upgrade, %d were written", len(want), len(w.written()))
	}
	c := waitAll(t, col, want, time.Minute)
	t.Logf("PostgreSQL %d -> %d under a running outbox: %s (%s in all)", oldMajor, newMajor, c, time.Since(began).Round(time.Millisecond))
	if c.missing != 0 || c.unexpected != 0 || c.orderViolations != 0 || (exactlyOnce && c.duplicates != 0) {
		t.Fatalf("across the upgrade: %s", c)
	}
	stopCleanly(t, p)
	if !exactlyOnce {
		return
	}
	// Once positions of the new cluster are committed, the takeover is
	// neither needed nor harmful: a start with it kept, SIGKILLed while
	// rows are written, then a start without it; each row once.
	p = streaming(t, e)
	stopWriting := w.writeInBackground(t.Context(), pg.DSN)
	waitfor.Until(t, time.Minute, "rows after the restart to be published", func() bool { return len(col.Records()) >= len(want)+100 })
	p.kill()
	p = streaming(t, e.with("WALRELAY_KAFKA_TRANSACTIONAL_ID_TAKEOVER", ""))
	time.Sleep(500 * time.Millisecond)
	if n := stopWriting(); n != 0 {
		t.Fatalf("%d writes failed", n)
	}
	want = committedIDs(t, conn)
	waitAll(t, col, want, time.Minute)
	time.Sleep(300 * time.Millisecond) // room for a late duplicate
	c = count(col.Records(), want)
	t.Logf("then a SIGKILL with the takeover kept and a start without it: %s", c)
	if c.missing != 0 || c.unexpected != 0 || c.orderViolations != 0 || c.duplicates != 0 {
		t.Fatalf("after the takeover: %s", c)
	}
	stopCleanly(t, p)
}

// upgradeWithoutSlots is TestPostgresMajorUpgrade from PostgreSQL 15 or
// 16, whose pg_upgrade does not carry logical slots (docs/upgrading.md:
// From PostgreSQL 15 or 16): walrelay catches up and stops, the cluster is
// upgraded, and run refuses the slot that is gone, naming slot create;
// rows written before the slot is created again (the writes resumed too
// early) are missing from the stream, and reconcile --replay sends them;
// rows written after it arrive through the slot. Every row is on the
// topics; the replayed ones out of order (docs/operations.md: Replay order).
func upgradeWithoutSlots(t *testing.T, pg *pgtest.Server, to string, e env, col *kafkatest.Collector, w *writer) {
	conn := connect(t, pg.DSN)
	p := streaming(t, e)
	if err := w.write(t.Context(), conn, 500, 10); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	waitLSNShowCaughtUp(t, e)
	stopCleanly(t, p)
	conn.Close(context.Background())
	oldMajor, err := pg.Version(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Upgrade(t.Context(), to, pgtest.UpgradeOptions{}); err != nil {
		t.Fatal(err)
	}
	newMajor, err := pg.Version(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	conn = connect(t, pg.DSN)
	if n := texts(t, conn, "SELECT count(*)::text FROM pg_replication_slots")[0]; n != "0" {
		t.Fatalf("pg_upgrade from %d carried %s slots", oldMajor, n)
	}
	p = start(t, e, "run")
	if code := p.exit(60 * time.Second); code != 1 || !strings.Contains(lastLine(p.out.String()), "walrelay slot create walrelay") {
		t.Fatalf("run on the upgraded cluster without its slot: exit %d:\n%s", code, tail(p.out.String(), 3000))
	}
	t.Logf("PostgreSQL %d -> %d, run without the slot: %s", oldMajor, newMajor, lastLine(p.out.String()))
	// The writes resumed before the slot was created again.
	if err := w.write(t.Context(), conn, 100, 10); err != nil {
		t.Fatal(err)
	}
	if p := start(t, e, "slot", "create"); p.exit(60*time.Second) != 0 {
		t.Fatalf("slot create:\n%s", p.out.String())
	}
	p = streaming(t, e)
	if err := w.write(t.Context(), conn, 300, 10); err != nil {
		t.Fatal(err)
	}
	want := committedIDs(t, conn)
	waitfor.Until(t, time.Minute, "the rows written after slot create", func() bool { return count(col.Records(), want).missing <= 100 })
	rc := start(t, e, "reconcile", "--all", "--replay", "--yes")
	code := rc.exit(2 * time.Minute)
	t.Logf("reconcile --all --replay --yes: exit %d: %s; %s", code, lineWith(rc.out.String(), "rows judged"), lineWith(rc.out.String(), "replayed the"))
	if code != 0 { // 0: every missing row was replayed
		t.Fatalf("reconcile: exit %d", code)
	}
	c := waitAll(t, col, want, time.Minute)
	t.Logf("PostgreSQL %d -> %d without the slot carried: %s", oldMajor, newMajor, c)
	// Order is not judged: the replayed rows come after later rows of
	// their aggregates (docs/operations.md: Replay order).
	if c.missing != 0 || c.unexpected != 0 {
		t.Fatalf("across the upgrade: %s", c)
	}
	stopCleanly(t, p)
}

// stopCleanly stops walrelay with SIGTERM and waits for its clean stop.
func stopCleanly(t *testing.T, p *proc) {
	t.Helper()
	p.signal(syscall.SIGTERM)
	if code := p.exit(40 * time.Second); code != 0 {
		t.Fatalf("SIGTERM: exit %d:\n%s", code, tail(p.out.String(), 3000))
	}
	if !strings.Contains(p.out.String(), "msg=stopped") {
		t.Fatalf("no clean stop logged:\n%s", tail(p.out.String(), 3000))
	}
}

// waitLSNShowCaughtUp waits until `walrelay lsn show` says the slot is 0
// bytes behind the server, and returns what it said.
func waitLSNShowCaughtUp(t *testing.T, e env) string {
	t.Helper()
	var said string
	waitfor.Until(t, time.Minute, "walrelay lsn show to say 0 bytes behind", func() bool {
		p := start(t, e, "lsn", "show")
		code := p.exit(30 * time.Second)
		said = strings.TrimSpace(p.out.String())
		return code == 0 && strings.Contains(said, " 0 bytes (0 B) behind")
	})
	return said
}

// lineWith returns the first line of s that contains sub.
func lineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// oldCommit is the earlier walrelay that TestResumesFromAnOlderWalrelay
// upgrades from (WALRELAY_TEST_OLD_COMMIT names another): the last commit
// whose position records on the offsets topic carry no timeline, and
// before migrate recorded the message horizon that run now requires
// (2026-12-04, "exactly-once: a committed position written under another
// transactional id is refused at start").
const oldCommit = "bae7b3c9f564b892f19a3db61814fdba07d8ace0"

// oldWalrelay builds, once, the walrelay of oldCommit (or of
// WALRELAY_TEST_OLD_COMMIT) from this repository's history: git archive
// into a temporary directory, go build there. skip says why it cannot
// (no git, or a checkout without that history).
var oldWalrelay = sync.OnceValues(func() (bin string, skip error) {
	commit := cmp.Or(os.Getenv("WALRELAY_TEST_OLD_COMMIT"), oldCommit)
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("no git repository around the test (%v): the older walrelay is built from this repository's history", err)
	}
	repo := strings.TrimSpace(string(root))
	if out, err := exec.Command("git", "-C", repo, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		return "", fmt.Errorf("commit %s is not in this checkout's history (a shallow clone?): %v %s", commit, err, out)
	}
	dir := filepath.Join(filepath.Dir(walrelayBin), "old-"+commit[:12])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tarball := dir + ".tar"
	if out, err := exec.Command("git", "-C", repo, "archive", "-o", tarball, commit).CombinedOutput(); err != nil {
		return "", fmt.Errorf("git archive %s: %v %s", commit, err, out)
	}
	if out, err := exec.Command("tar", "-xf", tarball, "-C", dir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("untar %s: %v %s", commit, err, out)
	}
	bin = filepath.Join(dir, "walrelay-old")
	build := exec.Command("go", "build", "-buildvcs=false", "-o", bin, "./cmd/walrelay")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build walrelay %s: %v\n%s", commit, err, out)
	}
	return bin, nil
})

// TestResumesFromAnOlderWalrelay: a walrelay built from an earlier commit
// of this repository (oldWalrelay) migrates a database and streams while
// rows are written without pause; it is stopped mid-stream (SIGTERM, or
// SIGKILL); the current walrelay, started on the same slot, configuration
// and offsets topic, first refuses until migrate ran (the order of an
// upgrade: stop, migrate, start), then resumes: every committed row is on
// the topics at least once, in order per aggregate, none lost; in
// exactly-once mode, after a SIGKILL, once (the current walrelay reads the
// old one's committed position, written without a timeline). Then a
// rollback in the same order (stop, the older migrate, start): the older
// walrelay publishes the rows written then, none twice.
func TestResumesFromAnOlderWalrelay(t *testing.T) {
	long(t)
	for _, tc := range []struct {
		name        string
		sig         syscall.Signal
		exactlyOnce bool
	}{
		{"SIGTERM", syscall.SIGTERM, false},
		{"SIGKILL", syscall.SIGKILL, false},
		{"exactly_once_SIGKILL", syscall.SIGKILL, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			built := time.Now()
			old, err := oldWalrelay()
			if err != nil {
				if os.Getenv("CI") != "" {
					t.Fatalf("the older walrelay: %v", err)
				}
				t.Skipf("the older walrelay: %v", err)
			}
			t.Logf("the older walrelay (%s) built or found in %s", cmp.Or(os.Getenv("WALRELAY_TEST_OLD_COMMIT"), oldCommit)[:12], time.Since(built).Round(time.Millisecond))
			testResumesFromAnOlderWalrelay(t, old, tc.sig, tc.exactlyOnce)
		})
	}
}

func testResumesFromAnOlderWalrelay(t *testing.T, old string, sig syscall.Signal, exactlyOnce bool) {
	began := time.Now()
	kc := newBroker(t)
	pg := pgtest.Start(t)
	if p := startBin(t, old, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate"); p.exit(60*time.Second) != 0 {
		t.Fatalf("the older migrate:\n%s", p.out.String())
	}
	var opts []kgo.Opt
	e := baseEnv(pg, kc)
	if exactlyOnce {
		e = eosEnv(pg, kc)
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	q := regexp.QuoteMeta(kc.prefix)
	col, err := kafkatest.Collect(kc.Addrs(), q+`outbox\.event\..*|`+q+`walrelay\.dlq`, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(col.Close)
	// The topics exist, as in production: the older walrelay's first
	// produce to a topic the real broker was still creating could fail
	// (UNKNOWN_TOPIC_OR_PARTITION, exit 1), a bug of that version.
	createTopic(t, kc.Addrs(), kc.topic("order"), nil)
	createTopic(t, kc.Addrs(), kc.dlq(), nil)
	conn := connect(t, pg.DSN)
	w := newWriter(30, 38)
	w.bytes = 100
	stopWriting := w.keepWriting(t.Context(), pg.DSN)

	p := startBin(t, old, e, "run")
	p.waitLog("msg=streaming", 60*time.Second)
	waitfor.Until(t, time.Minute, "the older walrelay to publish", func() bool { return len(col.Records()) >= 300 })
	p.signal(sig)
	code := p.exit(40 * time.Second)
	t.Logf("the older walrelay stopped by %s (exit %d): %d rows written, %d records, slot confirmed at %s",
		sig, code, len(w.written()), len(col.Records()), slotConfirmed(t, conn, "walrelay"))

	// Started before migrate, the current walrelay refuses, naming it.
	if p := start(t, e, "run"); p.exit(60*time.Second) == 0 || !strings.Contains(lastLine(p.out.String()), "walrelay migrate") {
		t.Fatalf("the current walrelay on the older one's database before migrate:\n%s", tail(p.out.String(), 3000))
	} else {
		t.Logf("before migrate: %s", lastLine(p.out.String()))
	}
	if p := start(t, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate"); p.exit(60*time.Second) != 0 {
		t.Fatalf("the current migrate on the older one's database:\n%s", p.out.String())
	} else {
		t.Logf("the current migrate on the older one's database:\n%s", p.out.String())
	}
	p = streaming(t, e)
	time.Sleep(time.Second)
	if n := stopWriting(); n != 0 {
		t.Fatalf("%d writes failed", n)
	}
	want := committedIDs(t, conn)
	waitAll(t, col, want, 2*time.Minute)
	time.Sleep(300 * time.Millisecond) // room for a late duplicate
	c := count(col.Records(), want)
	t.Logf("the current walrelay after the older one (%s, exactly_once=%v): rows committed %d, %s (%s in all)", sig, exactlyOnce, len(want), c, time.Since(began).Round(time.Millisecond))
	if c.missing != 0 || c.unexpected != 0 || c.orderViolations != 0 || (exactlyOnce || sig == syscall.SIGTERM) && c.duplicates != 0 {
		t.Fatalf("resuming from the older walrelay: %s", c)
	}

	// A rollback, in the same order: the current walrelay stops cleanly;
	// the older one refuses the database as the current migrate left it
	// (its walrelay_emit inserts rows), until its own migrate ran; then it
	// publishes what is written.
	stopCleanly(t, p)
	if p := startBin(t, old, e, "run"); p.exit(60*time.Second) == 0 || !strings.Contains(lastLine(p.out.String()), "walrelay migrate") {
		t.Fatalf("the older walrelay on the current one's database before its migrate:\n%s", tail(p.out.String(), 3000))
	} else {
		t.Logf("rollback, before the older migrate: %s", lastLine(p.out.String()))
	}
	if p := startBin(t, old, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate"); p.exit(60*time.Second) != 0 {
		t.Fatalf("the older migrate on the current one's database:\n%s", p.out.String())
	}
	p = startBin(t, old, e, "run")
	p.waitLog("msg=streaming", 60*time.Second)
	if err := w.write(t.Context(), conn, 200, 10); err != nil {
		t.Fatal(err)
	}
	want = committedIDs(t, conn)
	waitAll(t, col, want, time.Minute)
	time.Sleep(300 * time.Millisecond)
	after := count(col.Records(), want)
	t.Logf("rolled back to the older walrelay: rows committed %d, %s", len(want), after)
	if after.missing != 0 || after.orderViolations != 0 || after.duplicates != c.duplicates {
		t.Fatalf("after the rollback to the older walrelay: %s", after)
	}
	stopCleanly(t, p)
}
