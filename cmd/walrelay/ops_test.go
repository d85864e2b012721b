package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/cmd/walrelay/internal/admin"
	"github.com/walrelay/walrelay/replication"
)

// run runs a walrelay command to its end and returns its exit code and
// output.
func runCmd(t *testing.T, e env, args ...string) (int, string) {
	t.Helper()
	p := start(t, e, args...)
	code := p.exit(60 * time.Second)
	return code, p.out.String()
}

// mustRun runs walrelay with args and e, and fails the test unless it
// exits 0, naming the command and giving its output.
func mustRun(t *testing.T, e env, args ...string) {
	t.Helper()
	if code, out := runCmd(t, e, args...); code != 0 {
		t.Fatalf("%s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	_, body := httpStatus(t, url)
	return body
}

// httpStatus gets url and returns its status code and body.
func httpStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metricValue reads one sample of a Prometheus text exposition.
func metricValue(body, name string) (float64, bool) {
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, name+" ") {
			var v float64
			_, err := fmt.Sscanf(l[len(name)+1:], "%g", &v)
			return v, err == nil
		}
	}
	return 0, false
}

// TestOperatorCommands runs every slot, lsn, publication and status command
// against a live slot, and scrapes /metrics during a stream.
func TestOperatorCommands(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	adminAddr := freeAddr(t)
	e := baseEnv(pg, kc).with("WALRELAY_ADMIN_LISTEN", adminAddr)
	relay := streaming(t, e)
	ctx := t.Context()

	// slot list --json agrees with pg_replication_slots.
	code, out := runCmd(t, e, "slot", "list", "--json")
	if code != 0 {
		t.Fatalf("slot list: exit %d\n%s", code, out)
	}
	var slots []replication.SlotStatus
	if err := json.Unmarshal([]byte(out), &slots); err != nil {
		t.Fatalf("slot list --json: %v\n%s", err, out)
	}
	var pid int
	var confirmed string
	if err := conn.QueryRow(ctx, "SELECT active_pid, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'walrelay'").Scan(&pid, &confirmed); err != nil {
		t.Fatal(err)
	}
	if len(slots) != 1 || slots[0].SlotName != "walrelay" || !slots[0].Active || slots[0].ActivePID == nil || *slots[0].ActivePID != pid ||
		slots[0].Plugin != "pgoutput" || slots[0].LagBytes == nil || slots[0].RetainedWALBytes == nil {
		t.Fatalf("slot list: %s\nwant walrelay active in pid %d", out, pid)
	}
	code, out = runCmd(t, e, "slot", "status")
	if code != 0 || !strings.Contains(out, "walrelay") || !strings.Contains(out, "RETAINED_WAL") {
		t.Fatalf("slot status: exit %d\n%s", code, out)
	}

	// Refusals while the slot is active.
	code, out = runCmd(t, e, "slot", "drop", "walrelay", "--yes")
	// The pid is PostgreSQL's walsender's, not walrelay's: the client is
	// named by its address and application_name.
	holder := fmt.Sprintf("streamed by PostgreSQL's walsender pid %d for the client at 127.0.0.1:", pid)
	if code == 0 || !strings.Contains(out, holder) || !strings.Contains(out, "application_name walrelay") || strings.Contains(out, "that walrelay") {
		t.Fatalf("slot drop of an active slot: exit %d\n%s", code, out)
	}
	code, out = runCmd(t, e, "lsn", "advance", "walrelay", "--to-current", "--yes")
	if code == 0 || !strings.Contains(out, holder) {
		t.Fatalf("lsn advance of an active slot: exit %d\n%s", code, out)
	}

	// A stream moves the counters; the slot lag falls back after the burst.
	w := newWriter(10, 8)
	if err := w.write(ctx, conn, 2000, 20); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	deadline := time.Now().Add(20 * time.Second)
	for {
		body := httpGet(t, "http://"+adminAddr+"/metrics")
		published, _ := metricValue(body, `walrelay_events_published_total{table="public.outbox",topic="`+kc.topic("order")+`"}`)
		lag, lagOK := metricValue(body, "walrelay_slot_lag_bytes")
		streamingState, _ := metricValue(body, `walrelay_state{state="streaming"}`)
		if published == 2000 && lagOK && lag < 1<<20 && streamingState == 1 {
			if !strings.Contains(body, "walrelay_commit_to_ack_seconds_bucket") || !strings.Contains(body, `walrelay_reconnects_total{target="postgres"}`) ||
				!strings.Contains(body, "go_goroutines") || !strings.Contains(body, "process_resident_memory_bytes") ||
				!strings.Contains(body, "walrelay_kafka_connects_total") || !strings.Contains(body, "walrelay_kafka_produce_bytes_total") {
				t.Fatalf("metrics lack the latency histogram, reconnects, the runtime's and process's own or the Kafka client's:\n%s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics did not settle: published %v, lag %v (%v), streaming %v", published, lag, lagOK, streamingState)
		}
		time.Sleep(500 * time.Millisecond)
	}
	code, out = runCmd(t, e, "status", "--json")
	var st admin.Status
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.State != "streaming" || st.Published != 2000 || st.EventsPerSecond <= 0 {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	if got := httpGet(t, "http://"+adminAddr+"/readyz"); !strings.Contains(got, `"ready":true`) {
		t.Fatalf("readyz: %s", got)
	}
	if code, out := runCmd(t, e, "status", "--ready"); code != 0 || !strings.Contains(out, `"ready":true`) {
		t.Fatalf("status --ready of a streaming instance: exit %d\n%s", code, out)
	}
	if code, out := runCmd(t, e.with("WALRELAY_ADMIN_LISTEN", freeAddr(t)), "status", "--ready"); code == 0 {
		t.Fatalf("status --ready with nothing listening: exit 0\n%s", out)
	}
	if code, out := runCmd(t, e, "version"); code != 0 || !strings.Contains(out, "walrelay dev (commit unknown, built unknown, "+runtime.Version()) {
		t.Fatalf("version: exit %d\n%s", code, out)
	}
	if got := httpGet(t, "http://"+adminAddr+"/debug/pprof/"); !strings.Contains(got, "404 page not found") {
		t.Fatalf("/debug/pprof/ is served without admin.pprof: %.200s", got)
	}

	code, out = runCmd(t, e, "publication", "show", "--json")
	var pub replication.PublicationInfo
	if code != 0 || json.Unmarshal([]byte(out), &pub) != nil || strings.Join(pub.Tables, ",") != "public.outbox" || strings.Join(pub.Publish, ",") != "insert" {
		t.Fatalf("publication show: exit %d\n%s", code, out)
	}
	code, out = runCmd(t, e, "publication", "create")
	if code != 0 || !strings.Contains(out, "already exists") {
		t.Fatalf("publication create of an existing one: exit %d\n%s", code, out)
	}

	// Stopped: lsn advance says what it would do, then does it.
	relay.kill()
	waitSlotInactive(t, conn, "walrelay") // the walsender notices the closed connection
	if _, err := conn.Exec(ctx, "CREATE TABLE filler AS SELECT g FROM generate_series(1, 10000) g"); err != nil {
		t.Fatal(err)
	}
	before := slotConfirmed(t, conn, "walrelay")
	code, out = runCmd(t, e, "lsn", "advance", "walrelay", "--to-current")
	if code != 0 || !strings.Contains(out, "would move slot walrelay from "+before) || slotConfirmed(t, conn, "walrelay") != before {
		t.Fatalf("lsn advance without --yes: exit %d\n%s", code, out)
	}
	code, out = runCmd(t, e, "lsn", "advance", "walrelay", "--to-current", "--yes", "--json")
	var adv map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &adv) != nil || adv["done"] != true || adv["skipped_bytes"].(float64) <= 0 {
		t.Fatalf("lsn advance --yes: exit %d\n%s", code, out)
	}
	if after := slotConfirmed(t, conn, "walrelay"); after == before || after != adv["to"] {
		t.Fatalf("slot at %s after advancing from %s to %v", after, before, adv["to"])
	}
	code, out = runCmd(t, e, "lsn", "advance", "walrelay", "--to", "0/1", "--yes")
	if code == 0 || !strings.Contains(out, "cannot move back") {
		t.Fatalf("lsn advance backwards: exit %d\n%s", code, out)
	}
	code, out = runCmd(t, e, "lsn", "show")
	if code != 0 || !strings.Contains(out, "bytes") {
		t.Fatalf("lsn show: exit %d\n%s", code, out)
	}

	code, out = runCmd(t, e, "slot", "create", "spare")
	if code != 0 || !strings.Contains(out, "slot spare created") {
		t.Fatalf("slot create: exit %d\n%s", code, out)
	}
	// Without --yes a drop only says what it would do.
	code, out = runCmd(t, e, "slot", "drop", "spare")
	if code != 0 || !strings.Contains(out, "would drop slot spare (confirmed ") || !strings.Contains(out, "dry run: add --yes") {
		t.Fatalf("slot drop without --yes: exit %d\n%s", code, out)
	}
	if code, out = runCmd(t, e, "slot", "status", "spare"); code != 0 {
		t.Fatalf("the slot is gone after a dry run: exit %d\n%s", code, out)
	}
	code, out = runCmd(t, e, "slot", "drop", "spare", "--yes")
	if code != 0 || !strings.Contains(out, "slot spare dropped") {
		t.Fatalf("slot drop --yes: exit %d\n%s", code, out)
	}
	code, out = runCmd(t, e, "publication", "drop", "walrelay_outbox")
	if code != 0 || !strings.Contains(out, "would drop publication walrelay_outbox (of public.outbox)") {
		t.Fatalf("publication drop without --yes: exit %d\n%s", code, out)
	}
	if code, out = runCmd(t, e, "publication", "show"); code != 0 || !strings.Contains(out, "public.outbox") {
		t.Fatalf("the publication is gone after a dry run: exit %d\n%s", code, out)
	}
}

// TestCheck: the preflight passes on a migrated database and names the fix
// for a missing column, a missing publication and a role without REPLICATION.
func TestCheck(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	conn := connect(t, pg.DSN)
	ctx := t.Context()
	e := baseEnv(pg, kc)
	code, out := runCmd(t, e, "check")
	if code != 0 || !strings.Contains(out, "OK    wal_level") || !strings.Contains(out, "WARN  max_slot_wal_keep_size") || !strings.Contains(out, "OK    kafka brokers") {
		t.Fatalf("check on a good setup: exit %d\n%s", code, out)
	}
	for _, sql := range []string{
		"CREATE TABLE notype (id uuid, aggregatetype text, aggregateid text, payload jsonb)",
		"CREATE ROLE app LOGIN",
		"GRANT SELECT ON ALL TABLES IN SCHEMA public TO app",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name string
		env  env
		want string
	}{
		{"missing column", e.with("WALRELAY_POSTGRES_TABLE", "public.notype", "WALRELAY_POSTGRES_PUBLICATION", "walrelay_outbox"), `FAIL  column type                table public.notype has no column "type"`},
		{"missing publication", e.with("WALRELAY_POSTGRES_PUBLICATION", "nopub"), "FAIL  publication                publication nopub does not exist"},
		{"no replication role", e.with("WALRELAY_POSTGRES_DSN", pg.DSNFor("postgres")+"&user=app"), `lacks the REPLICATION attribute: ALTER ROLE "app" REPLICATION`},
	}
	for _, tc := range cases {
		code, out := runCmd(t, tc.env, "check")
		if code == 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit %d, want a line with %q:\n%s", tc.name, code, tc.want, out)
		}
	}
	// run names the same fix as check, not PostgreSQL's raw error.
	app := e.with("WALRELAY_POSTGRES_DSN", pg.DSNFor("postgres")+"&user=app")
	if code, out := runCmd(t, app, "run"); code != 1 || !strings.Contains(lastLine(out), `lacks the REPLICATION attribute: ALTER ROLE "app" REPLICATION`) {
		t.Errorf("run as a role without REPLICATION: exit %d:\n%s", code, tail(out, 2000))
	}
}

// TestDemo builds the demo (the demo tag: the connector's binary leaves the
// test harness out, and says how to get it) and runs it with --crash: 20
// orders, the relay and the consumer killed once each, one shipment per
// order.
func TestDemo(t *testing.T) {
	long(t) // builds the demo binary; kills the relay and the consumer
	t.Parallel()
	if code, out := runCmd(t, env{}, "demo"); code != 1 || !strings.Contains(out, "-tags demo") {
		t.Fatalf("demo in the connector's binary: exit %d, want how to build it:\n%s", code, out)
	}
	bin := walrelayBin + "-demo"
	if out, err := osexec.Command("go", "build", "-tags", "demo", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build the demo: %v\n%s", err, out)
	}
	p := startBin(t, bin, env{}, "demo", "--count", "20", "--every", "20ms", "--crash")
	if code := p.exit(2 * time.Minute); code != 0 || !strings.Contains(p.out.String(), "shipments created: 20 for 20 orders (exactly one per order: yes)") ||
		strings.Count(p.out.String(), "*** SIGKILL") != 2 {
		t.Fatalf("demo --crash: exit %d\n%s", code, p.out.String())
	}
	t.Logf("demo --crash:%s", p.out.String()[strings.LastIndex(p.out.String(), "\nrows committed"):])
}

// TestDebeziumImportCommand: walrelay debezium import prints walrelay's
// YAML on stdout and names what it ignores on stderr (the password never);
// with an option walrelay does not reproduce it exits 1 with one line.
func TestDebeziumImportCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conn := filepath.Join(dir, "outbox.json")
	writeFile(t, conn, `{"name": "outbox", "config": {"connector.class": "io.debezium.connector.postgresql.PostgresConnector", "plugin.name": "pgoutput",
		"database.hostname": "db", "database.user": "dbz", "database.password": "pg-s3cret", "database.dbname": "app", "tasks.max": 1,
		"transforms": "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter"}}`)
	worker := filepath.Join(dir, "worker.properties")
	writeFile(t, worker, "bootstrap.servers=kafka:9092\nkey.converter=org.apache.kafka.connect.storage.StringConverter\nvalue.converter=org.apache.kafka.connect.storage.StringConverter\n")
	code, out := runCmd(t, env{}, "debezium", "import", conn, "--worker", worker)
	if code != 0 || !strings.Contains(out, "dsn: postgres://dbz@db:5432/app") || !strings.Contains(out, "slot: debezium") ||
		!strings.Contains(out, "brokers: ['kafka:9092']") || !strings.Contains(out, "ignored: tasks.max:") || strings.Contains(out, "tasks.max=") || strings.Contains(out, "pg-s3cret") {
		t.Fatalf("debezium import: exit %d:\n%s", code, out)
	}
	t.Logf("debezium import:\n%s", out)
	// Connect's default converter is the JsonConverter: refused, with
	// another option walrelay does not know; one refusal a line, no YAML.
	withUnknown := filepath.Join(dir, "unknown.json")
	writeFile(t, withUnknown, strings.Replace(readFile(t, conn), `"tasks.max": 1,`, `"tasks.max": 1, "some.future.option": "x",`, 1))
	code, out = runCmd(t, env{}, "debezium", "import", withUnknown)
	t.Logf("debezium import without the worker's converters:\n%s", out)
	for _, o := range []string{"key.converter", "value.converter", "some.future.option"} {
		if !regexp.MustCompile(`(?m)^refused: ` + regexp.QuoteMeta(o) + `: .{10,200}$`).MatchString(out) {
			t.Errorf("no line of its own refuses %s", o)
		}
	}
	if code != 1 || strings.Contains(out, "# walrelay configuration") || !strings.Contains(lastLine(out), "the 3 option(s) refused above, so no YAML was written") {
		t.Fatalf("without the worker's converters: exit %d:\n%s", code, out)
	}
	// The converters in the connector's configuration, no worker: the
	// YAML, and kafka.brokers named as missing (stderr and the file).
	conv := filepath.Join(dir, "conv.json")
	writeFile(t, conv, strings.Replace(readFile(t, conn), `"tasks.max": 1,`, `"tasks.max": 1, "key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter",`, 1))
	code, out = runCmd(t, env{}, "debezium", "import", conv)
	if code != 0 || !strings.Contains(out, "missing: kafka.brokers: bootstrap.servers is in the Kafka Connect worker's configuration") ||
		!strings.Contains(out, "# MISSING kafka.brokers:") || strings.Contains(out, "ignored: bootstrap.servers") {
		t.Fatalf("without the worker: exit %d:\n%s", code, out)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSlotOfAnotherDatabase: the default slot name, taken by walrelay in
// another database of the same cluster, stops migrate, run and check with
// the fix (postgres.slot) rather than a bare refusal.
func TestSlotOfAnotherDatabase(t *testing.T) {
	t.Parallel()
	pg, kc, _, conn := bareSetup(t)
	execSQL(t, conn, "CREATE DATABASE billing")
	billing := strings.Replace(pg.DSN, "/postgres?", "/billing?", 1)
	e := baseEnv(pg, kc)
	if code, out := runCmd(t, e.with("WALRELAY_POSTGRES_DSN", billing), "migrate"); code != 0 {
		t.Fatalf("migrate in database billing: exit %d\n%s", code, out)
	}
	refused := func(args ...string) {
		t.Helper()
		code, out := runCmd(t, e, args...)
		if code == 0 || !strings.Contains(out, `slot walrelay is the slot of database "billing", not of "postgres"`) || !strings.Contains(out, "postgres.slot") {
			t.Errorf("%s with the slot name of another database: exit %d\n%s", args[0], code, out)
		}
		if args[0] == "migrate" && (strings.Contains(out, "created") || !strings.Contains(out, "migrate changed nothing")) {
			t.Errorf("migrate changed something before it refused the slot name:\n%s", out)
		}
	}
	refused("migrate")
	if code, out := runCmd(t, e.with("WALRELAY_POSTGRES_SLOT", "walrelay_postgres"), "migrate"); code != 0 {
		t.Fatalf("migrate with a slot of its own: exit %d\n%s", code, out)
	}
	refused("run")
	refused("check")
}
