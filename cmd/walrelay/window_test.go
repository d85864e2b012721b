package main

import (
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/outbox"
)

// insertBoth writes n rows with random ids, as the README's SQL does, and n
// with UUIDv7 ids, as package outbox does, the random ones first, under
// aggregate ids tag-….
func insertBoth(t *testing.T, dsn, tag string, n int) {
	t.Helper()
	conn := connect(t, dsn)
	execSQL(t, conn, fmt.Sprintf(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), 'order', '%s-v4-' || i, 'OrderCreated', '{"total": 12.5}' FROM generate_series(1, %d) i`, tag, n))
	for i := range n {
		execSQL(t, conn, fmt.Sprintf(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('%s', 'order', '%s-v7-%d', 'OrderCreated', '{"total": 12.5}')`, outbox.NewID(), tag, i))
	}
}

// TestTimeWindowsOnMixedIDs walks the runbook of a skipped stretch of WAL on
// the table migrate creates, written with random ids (the README's SQL)
// and UUIDv7 ids (package outbox) alike: lsn advance's hint, reconcile
// --since, reconcile --since --replay --yes (exit 0: every missing row
// sent), replay --since and prune --older-than all work on it. Before, the
// windows were refused (the ids of public.outbox are not UUIDv7), and
// reconcile --replay --yes exited 2 after replaying every missing row.
func TestTimeWindowsOnMixedIDs(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	e := baseEnv(pg, kc)
	p := streaming(t, e)
	insertBoth(t, pg.DSN, "before", 5)
	waitfor.Until(t, time.Minute, "10 published", func() bool { c, _ := onTopics(col, kc); return len(c) == 10 })
	p.signal(syscall.SIGTERM)
	if code := p.exit(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	insertBoth(t, pg.DSN, "gap", 4)
	code, out := runCmd(t, e, "lsn", "advance", "--to-current", "--yes")
	if code != 0 || !strings.Contains(out, "walrelay reconcile --since <a time before the skipped rows>") {
		t.Fatalf("lsn advance: exit %d, want a hint naming reconcile --since:\n%s", code, out)
	}
	p = streaming(t, e)
	code, out = runCmd(t, e, "reconcile", "--since", "10m")
	if code != 2 || !strings.Contains(out, "18 rows judged") || !strings.Contains(out, "8 missing") {
		t.Fatalf("reconcile --since 10m: exit %d, want the 8 rows of the gap missing of 18:\n%s", code, out)
	}
	code, out = runCmd(t, e, "reconcile", "--since", "10m", "--replay", "--yes")
	if code != 0 || !strings.Contains(out, "replayed the 8 missing rows") {
		t.Fatalf("reconcile --since 10m --replay --yes: exit %d, want 0 after replaying the 8 rows:\n%s", code, out)
	}
	waitfor.Until(t, time.Minute, "18 on the topic", func() bool { c, _ := onTopics(col, kc); return len(c) == 18 })
	if code, out := runCmd(t, e, "reconcile", "--since", "10m"); code != 0 || !strings.Contains(out, "0 missing") {
		t.Fatalf("the second reconcile: exit %d:\n%s", code, out)
	}
	if code, out := runCmd(t, e, "replay", "--since", "10m"); code != 0 || !strings.Contains(out, "would send 18 rows") {
		t.Fatalf("replay --since 10m: exit %d:\n%s", code, out)
	}
	execSQL(t, connect(t, pg.DSN), "UPDATE outbox SET created_at = now() - interval '2 hours' WHERE aggregateid LIKE 'before-%'")
	if code, out := runCmd(t, e, "prune", "--older-than", "1h", "--yes"); code != 0 || !strings.Contains(out, "deleted 10 rows") {
		t.Fatalf("prune --older-than 1h: exit %d, want the 10 old rows of both kinds deleted:\n%s", code, out)
	}
	p.signal(syscall.SIGTERM)
	p.exit(time.Minute)
}

// TestMigrateGivesTimeWindows: a table of the layout before created_at,
// its ids mixed (a UUIDv7 first): lsn advance's hint names --all and a time
// window is refused naming migrate (before, the hint named --since, and the
// window, looking at the UUIDv7 row only, placed the random ids by their
// random bits); walrelay migrate adds created_at, and then the hint names
// --since and reconcile --since judges every row.
func TestMigrateGivesTimeWindows(t *testing.T) {
	t.Parallel()
	kc := newBroker(t)
	pg := pgtest.Start(t)
	e := baseEnv(pg, kc)
	conn := connect(t, pg.DSN)
	execSQL(t, conn, `CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)`)
	for _, args := range [][]string{{"publication", "create"}, {"slot", "create"}} {
		if code, out := runCmd(t, e, args...); code != 0 {
			t.Fatalf("%v: exit %d\n%s", args, code, out)
		}
	}
	execSQL(t, conn, fmt.Sprintf(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('%s', 'order', 'a-v7', 'T', '{}'), (gen_random_uuid(), 'order', 'a-v4', 'T', '{}')`, outbox.NewID()))
	code, out := runCmd(t, e, "lsn", "advance", "--to-current", "--yes")
	if code != 0 || !strings.Contains(out, "walrelay reconcile --all (public.outbox cannot place its rows in time") {
		t.Fatalf("lsn advance on the old table: exit %d, want a hint naming --all:\n%s", code, out)
	}
	code, out = runCmd(t, e, "reconcile", "--since", "10m", "--wait", "1s")
	if code != 1 || !strings.Contains(lastLine(out), "are not all UUIDv7") || !strings.Contains(lastLine(out), "run walrelay migrate") {
		t.Fatalf("reconcile --since on the old table: exit %d, want a refusal naming migrate:\n%s", code, out)
	}
	code, out = runCmd(t, e, "migrate")
	if code != 0 || !regexp.MustCompile(`column public\.outbox\.created_at\s+added`).MatchString(out) {
		t.Fatalf("migrate of the old table: exit %d, want created_at added:\n%s", code, out)
	}
	t.Logf("migrate:\n%s", out)
	code, out = runCmd(t, e, "lsn", "advance", "--to-current", "--yes")
	if code != 0 || !strings.Contains(out, "walrelay reconcile --since <a time before the skipped rows>") {
		t.Fatalf("lsn advance after migrate: exit %d, want a hint naming --since:\n%s", code, out)
	}
	if !strings.Contains(out, "are of unknown time and in no --since window") {
		t.Fatalf("lsn advance after migrate: want the rows of unknown time named:\n%s", out)
	}
	// The UUIDv7 row is placed by its id's time; the random one written
	// before created_at is of unknown time, in no window with a start.
	code, out = runCmd(t, e, "reconcile", "--since", "10m", "--wait", "1s")
	if code != 2 || !strings.Contains(out, "1 rows judged") {
		t.Fatalf("reconcile --since 10m after migrate: exit %d, want the UUIDv7 row judged (missing):\n%s", code, out)
	}
	code, out = runCmd(t, e, "reconcile", "--all", "--wait", "1s")
	if code != 2 || !strings.Contains(out, "2 rows judged") {
		t.Fatalf("reconcile --all after migrate: exit %d, want both rows judged (missing):\n%s", code, out)
	}
}

// TestReconcileSinceAfterMigrateLeavesOlderRowsOut: walrelay migrate gives
// an existing outbox created_at; the rows already there, published days
// before, take a time before any window (migrations.CreatedAtUnknown), so
// reconcile --since 1h right after migrate judges none of them (its topics
// read from an hour ago, less a margin, would not hold them). Before, they
// took the migration's time: all 50 counted missing, and --replay --yes
// would have sent the whole old table again.
func TestReconcileSinceAfterMigrateLeavesOlderRowsOut(t *testing.T) {
	t.Parallel()
	kc := newBroker(t)
	pg := pgtest.Start(t)
	conn := connect(t, pg.DSN)
	ctx := t.Context()
	// The layout before created_at, with 50 rows published two days ago.
	execSQL(t, conn, `CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)`)
	ids := texts(t, conn, `INSERT INTO outbox SELECT gen_random_uuid(), 'order', 'order-' || g, 'T', '{}' FROM generate_series(1, 50) g RETURNING id::text`)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	then := time.Now().Add(-48 * time.Hour)
	var recs []*kgo.Record
	for i, id := range ids {
		recs = append(recs, &kgo.Record{Topic: kc.topic("order"), Key: []byte(fmt.Sprintf("order-%d", i+1)), Value: []byte("{}"), Timestamp: then,
			Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(id)}}})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	e := baseEnv(pg, kc)
	mustRun(t, e, "migrate")
	code, out := runCmd(t, e, "reconcile", "--since", "1h", "--wait", "1s")
	if code != 0 || !strings.Contains(out, " 0 missing") {
		t.Fatalf("reconcile --since 1h right after migrate of an outbox whose 50 rows were published two days ago: exit %d, want 0 and none missing (the rows are not of the last hour)\n%s", code, tail(out, 800))
	}
}
