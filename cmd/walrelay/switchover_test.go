package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
)

// debeziumAsItWas gives a test the database of a team on Debezium's
// defaults, without Debezium: the outbox table the application made, the
// publication Debezium creates by default (dbz_publication, FOR ALL
// TABLES), Debezium's pgoutput slot, and Debezium's configuration files
// (its defaults: no publication.* key) in dir.
func debeziumAsItWas(t *testing.T, slot string) (pg *pgtest.Server, kc *broker, col *kafkatest.Collector, conn *pgx.Conn, dir string) {
	t.Helper()
	pg, kc, col, conn = bareSetup(t)
	execSQL(t, conn, `CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
		type varchar(255) NOT NULL, payload jsonb)`,
		"CREATE PUBLICATION dbz_publication FOR ALL TABLES",
		"SELECT pg_create_logical_replication_slot('"+slot+"', 'pgoutput')")
	worker, connector := kafkatest.DebeziumOutbox(kc.Addrs(), pg.Port(), slot, "dbz", kc.prefix+"outbox.event.${routedByValue}")
	delete(connector, "publication.name")
	delete(connector, "publication.autocreate.mode")
	dir = t.TempDir()
	writeFile(t, filepath.Join(dir, "worker.properties"), kafkatest.Properties(worker))
	writeFile(t, filepath.Join(dir, "connector.properties"), kafkatest.Properties(connector))
	return pg, kc, col, conn, dir
}

// debeziumReading stands in for a running Debezium: it streams slot with
// Debezium's publication and confirms what it received, as Debezium does
// with heartbeats, until the returned stop. It publishes nothing: the test
// sends the rows Debezium would have (debeziumPublished).
func debeziumReading(t *testing.T, dsn, slot string) (stop func()) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.StartReplication(t.Context(), conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'dbz_publication'"}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() {
		var pos pglogrepl.LSN
		next := time.Now()
		for ctx.Err() == nil {
			if time.Now().After(next) {
				_ = pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos})
				next = time.Now().Add(100 * time.Millisecond)
			}
			rctx, rcancel := context.WithTimeout(ctx, 100*time.Millisecond)
			msg, err := conn.ReceiveMessage(rctx)
			rcancel()
			if err != nil {
				if pgconn.Timeout(err) {
					continue
				}
				return
			}
			cd, ok := msg.(*pgproto3.CopyData)
			if !ok || len(cd.Data) == 0 {
				continue
			}
			switch cd.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				if ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:]); err == nil {
					pos = max(pos, ka.ServerWALEnd)
				}
			case pglogrepl.XLogDataByteID:
				if x, err := pglogrepl.ParseXLogData(cd.Data[1:]); err == nil {
					pos = max(pos, x.WALStart+pglogrepl.LSN(len(x.WALData)))
				}
			}
		}
	})
	return func() {
		cancel()
		wg.Wait()
		conn.Close(context.Background())
	}
}

// debeziumPublished sends the rows of ids to the outbox topics as Debezium's
// EventRouter with the StringConverter writes them (key the aggregate id,
// value the payload, the id header), in commit order.
func debeziumPublished(t *testing.T, kc *broker, conn *pgx.Conn, ids []string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, id := range ids {
		var agg, aggID, payload string
		if err := conn.QueryRow(t.Context(), "SELECT aggregatetype, aggregateid, payload::text FROM outbox WHERE id = $1", id).Scan(&agg, &aggID, &payload); err != nil {
			t.Fatal(err)
		}
		r := &kgo.Record{Topic: kc.topic(agg), Key: []byte(aggID), Value: []byte(payload), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(id)}}}
		if err := cl.ProduceSync(t.Context(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// importDebezium runs walrelay debezium import of dir's files and writes
// the YAML to dir/walrelay.yaml; it returns the command's output.
func importDebezium(t *testing.T, dir string) (cfgFile, out string) {
	t.Helper()
	code, out := step(t, env{}, "debezium", "import", filepath.Join(dir, "connector.properties"), "--worker", filepath.Join(dir, "worker.properties"))
	if code != 0 {
		t.Fatalf("debezium import: exit %d:\n%s", code, out)
	}
	cfgFile = filepath.Join(dir, "walrelay.yaml")
	writeFile(t, cfgFile, out[strings.Index(out, "# walrelay configuration"):])
	return cfgFile, out
}

// step runs a walrelay command of the switch-over as the user types it,
// logs it with its output, and returns them.
func step(t *testing.T, e env, args ...string) (int, string) {
	t.Helper()
	code, out := runCmd(t, e, args...)
	t.Logf("$ walrelay %s\n%s(exit %d)", strings.Join(args, " "), out, code)
	return code, out
}

// checkLine is the line of walrelay check's output about name.
func checkLine(out, name string) string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[1] == name {
			return l
		}
	}
	return ""
}

// TestSwitchOverFromDebeziumAllTables walks docs/debezium.md's switch-over
// from a Debezium on its defaults (publication dbz_publication FOR ALL
// TABLES, created before the slot): while Debezium still reads the slot,
// walrelay publication create makes walrelay_outbox behind the slot (it
// says to keep Debezium running), walrelay check says OK for the slot once
// Debezium has confirmed past the publication's creation, Debezium stops,
// walrelay runs on Debezium's slot: every row on the topic.
func TestSwitchOverFromDebeziumAllTables(t *testing.T) {
	t.Parallel()
	const slot = "debezium"
	pg, kc, col, conn, dir := debeziumAsItWas(t, slot)
	stopDebezium := debeziumReading(t, pg.DSN, slot)
	w := newWriter(10, 71)
	if err := w.write(t.Context(), conn, 100, 5); err != nil {
		t.Fatal(err)
	}
	cfgFile, out := importDebezium(t, dir)
	if !strings.Contains(out, "publication: walrelay_outbox") || !strings.Contains(out, "1. while Debezium still runs: walrelay publication create") {
		t.Fatalf("the import does not name walrelay_outbox and the switch-over's order:\n%s", out)
	}
	e := env{"WALRELAY_ADMIN_LISTEN": "", "WALRELAY_KAFKA_DLQ_TOPIC": kc.dlq()}
	code, out := step(t, e, "publication", "create", "--config", cfgFile)
	if code != 0 || !strings.Contains(out, "keep that reader (Debezium) running until walrelay check says OK") {
		t.Fatalf("publication create while Debezium reads the slot: exit %d:\n%s", code, out)
	}
	if err := w.write(t.Context(), conn, 50, 5); err != nil {
		t.Fatal(err)
	}
	var last string
	waitfor.Until(t, 30*time.Second, "walrelay check says OK for the slot", func() bool {
		_, out := runCmd(t, e, "check", "--config", cfgFile)
		last = out
		return strings.HasPrefix(checkLine(out, "slot"), "OK")
	})
	t.Logf("$ walrelay check --config walrelay.yaml\n%s", last)
	stopDebezium()
	debeziumPublished(t, kc, conn, w.written()) // what Debezium had sent
	waitSlotInactive(t, conn, slot)
	p := start(t, e, "run", "--config", cfgFile)
	p.waitLog("msg=streaming", time.Minute)
	if err := w.write(t.Context(), conn, 50, 5); err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, committedIDs(t, conn), time.Minute)
	t.Logf("switched over on slot %s with Debezium's FOR ALL TABLES publication left as it was: %s", slot, c)
	p.signal(syscall.SIGTERM)
	if code := p.exit(time.Minute); code != 0 {
		t.Fatalf("run exited %d", code)
	}
}

// TestSwitchOverAfterDebeziumStopped is the newcomer's path of issue 37:
// Debezium (defaults, FOR ALL TABLES) stopped first, rows written after it
// stopped, then walrelay. check names the cause and the way out, walrelay
// refuses to create walrelay_outbox behind the slot (publication create,
// migrate and run); a publication created behind it anyway (by hand, or by an
// older walrelay) makes check fail on the slot and run refuse to start
// with the cause in one sentence, where it used to fail at every start
// with `publication "walrelay_outbox" does not exist` while check said OK.
// walrelay slot resync --yes moves the slot past the publication and
// replays the rows of the gap from the table; run then streams: every row
// on the topic.
func TestSwitchOverAfterDebeziumStopped(t *testing.T) {
	t.Parallel()
	const slot = "debezium"
	pg, kc, col, conn, dir := debeziumAsItWas(t, slot)
	stopDebezium := debeziumReading(t, pg.DSN, slot)
	w := newWriter(10, 72)
	if err := w.write(t.Context(), conn, 60, 5); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // Debezium confirms them
	stopDebezium()
	debeziumPublished(t, kc, conn, w.written())
	waitSlotInactive(t, conn, slot)
	// Written while neither runs: in the slot, not on the topic.
	if err := w.write(t.Context(), conn, 40, 5); err != nil {
		t.Fatal(err)
	}
	cfgFile, _ := importDebezium(t, dir)
	e := env{"WALRELAY_ADMIN_LISTEN": "", "WALRELAY_KAFKA_DLQ_TOPIC": kc.dlq()}

	_, out := step(t, e, "check", "--config", cfgFile)
	if l := checkLine(out, "publication"); !strings.HasPrefix(l, "FAIL") || !strings.Contains(l, "publication walrelay_outbox does not exist, and slot debezium does") || !strings.Contains(l, "walrelay slot resync --yes") {
		t.Fatalf("check without the publication:\n%s", out)
	}
	for _, args := range [][]string{{"publication", "create", "--config", cfgFile}, {"migrate", "--config", cfgFile}, {"run", "--config", cfgFile}} {
		code, out := step(t, e, args...)
		if code == 0 || !strings.Contains(out, "created now, the publication would be after the slot's position") {
			t.Fatalf("%s behind the slot: exit %d:\n%s", args[0], code, out)
		}
	}
	var exists bool
	if err := conn.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'walrelay_outbox')").Scan(&exists); err != nil || exists {
		t.Fatalf("walrelay_outbox created behind the slot: %v %v", exists, err)
	}

	// Created behind the slot anyway (by hand, or an older walrelay).
	execSQL(t, conn, "CREATE PUBLICATION walrelay_outbox FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = true)")
	if err := w.write(t.Context(), conn, 20, 5); err != nil {
		t.Fatal(err)
	}
	_, out = step(t, e, "check", "--config", cfgFile)
	if l := checkLine(out, "slot"); !strings.HasPrefix(l, "FAIL") || !strings.Contains(l, "slot debezium's position is before publication walrelay_outbox was created") {
		t.Fatalf("check with the publication behind the slot: slot line %q:\n%s", l, out)
	}
	code, out := step(t, e, "run", "--config", cfgFile)
	if code == 0 || !strings.Contains(lastLine(out), "slot debezium's position is before publication walrelay_outbox was created") || !strings.Contains(lastLine(out), "walrelay slot resync --yes") {
		t.Fatalf("run with the publication behind the slot: exit %d:\n%s", code, out)
	}

	code, out = step(t, e, "slot", "resync", "--config", cfgFile)
	if code != 0 || !strings.Contains(out, "would move slot debezium") {
		t.Fatalf("slot resync (dry run): exit %d:\n%s", code, out)
	}
	code, out = step(t, e, "slot", "resync", "--yes", "--config", cfgFile)
	if code != 0 || !strings.Contains(out, "slot debezium resynced with publication walrelay_outbox") {
		t.Fatalf("slot resync --yes: exit %d:\n%s", code, out)
	}
	_, out = step(t, e, "check", "--config", cfgFile)
	if l := checkLine(out, "slot"); !strings.HasPrefix(l, "OK") {
		t.Fatalf("check after the resync: slot line %q", l)
	}
	p := start(t, e, "run", "--config", cfgFile)
	p.waitLog("msg=streaming", time.Minute)
	if err := w.write(t.Context(), conn, 30, 5); err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, committedIDs(t, conn), time.Minute)
	t.Logf("every row on the topic after the resync: %s", c)
	p.signal(syscall.SIGTERM)
	if code := p.exit(time.Minute); code != 0 {
		t.Fatalf("run exited %d", code)
	}
}

// TestPublicationDroppedUnderRunningSlot: the publication dropped while
// walrelay streams stops it at the next transaction with the cause
// (PostgreSQL up to 17 fails the stream; 18 skips the publication with a
// WARNING, and the rows with it: walrelay stops on that WARNING instead of
// confirming past them), and the slot is not confirmed past the row;
// created again, check and run name the gap and slot resync --yes closes
// it: every row on the topic.
func TestPublicationDroppedUnderRunningSlot(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	p := streaming(t, e)
	w := newWriter(5, 73)
	if err := w.write(t.Context(), conn, 20, 5); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	execSQL(t, conn, "DROP PUBLICATION walrelay_outbox")
	if err := w.write(t.Context(), conn, 10, 5); err != nil {
		t.Fatal(err)
	}
	if code := p.exit(time.Minute); code != 1 || !strings.Contains(lastLine(p.out.String()), "walrelay_outbox") {
		t.Fatalf("exit %d, want a stop naming the publication:\n%s", code, tail(p.out.String(), 2000))
	}
	t.Logf("dropped under the running slot: %s", lastLine(p.out.String()))
	execSQL(t, conn, "CREATE PUBLICATION walrelay_outbox FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = true)")
	if code, out := runCmd(t, e, "run"); code != 1 || !strings.Contains(lastLine(out), "position is before publication walrelay_outbox was created") {
		t.Fatalf("run after the publication was created again: exit %d:\n%s", code, tail(out, 2000))
	}
	if code, out := step(t, e, "slot", "resync", "--yes"); code != 0 {
		t.Fatalf("slot resync --yes: exit %d:\n%s", code, out)
	}
	p = streaming(t, e)
	if err := w.write(t.Context(), conn, 10, 5); err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, committedIDs(t, conn), time.Minute)
	t.Logf("every row on the topic: %s", c)
	p.signal(syscall.SIGTERM)
	p.exit(time.Minute)
}

// TestSwitchOverSlotDropOnStop: review of #37 (trap 1's switch-over). With
// the connector's slot.drop.on.stop=true, stopping Debezium drops the slot
// walrelay is to take over. debezium import warns of it at the top of the
// steps (set it false first); publication create records the slot on the
// publication, so that walrelay run, finding it dropped anyway, stops and
// says the slot is gone instead of creating a new one at the end of the
// WAL, after the rows committed meanwhile, silently.
func TestSwitchOverSlotDropOnStop(t *testing.T) {
	t.Parallel()
	const slot = "debezium"
	pg, kc, _, conn, dir := debeziumAsItWas(t, slot)
	f, err := os.OpenFile(filepath.Join(dir, "connector.properties"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("slot.drop.on.stop=true\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	stopDebezium := debeziumReading(t, pg.DSN, slot)
	cfgFile, out := importDebezium(t, dir)
	warn, first := strings.Index(out, "# WARNING: the connector has slot.drop.on.stop=true: stopping Debezium DROPS slot debezium"), strings.Index(out, "#   1. while Debezium still runs")
	if warn < 0 || first < 0 || warn > first || !strings.Contains(out, "0. set slot.drop.on.stop=false on the connector first") {
		t.Errorf("debezium import of a connector with slot.drop.on.stop=true does not warn at the top of the steps:\n%s", out)
	}
	e := env{"WALRELAY_ADMIN_LISTEN": "", "WALRELAY_KAFKA_DLQ_TOPIC": kc.dlq()}
	code, out := step(t, e, "publication", "create", "--config", cfgFile)
	if code != 0 || !strings.Contains(out, "slot debezium recorded on publication walrelay_outbox") {
		t.Errorf("publication create while Debezium reads the slot: exit %d, the slot not said recorded:\n%s", code, out)
	}
	stopDebezium()
	waitSlotInactive(t, conn, slot)
	execSQL(t, conn, "SELECT pg_drop_replication_slot('"+slot+"')") // what slot.drop.on.stop=true does
	p := start(t, e, "run", "--config", cfgFile)
	code = p.exit(30 * time.Second) // it used to stream on a new slot: no exit
	if code == 0 || !strings.Contains(p.out.String(), "the replication slot was dropped") || slotExists(t, conn, slot) {
		t.Fatalf("walrelay run after the taken-over slot was dropped: exit %d, slot %s exists again: %v, last line %q: want a refusal saying the slot is gone, and no new slot",
			code, slot, slotExists(t, conn, slot), lastLine(p.out.String()))
	}
}
