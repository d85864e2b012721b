package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/outbox"
	"github.com/walrelay/walrelay/sink"
)

// onTopics returns how many records of each event id the collector holds
// on the test's outbox topics (not the dead-letter topic), and the records
// with the replay header.
func onTopics(col *kafkatest.Collector, kc *broker) (count map[string]int, replayed map[string]*kgo.Record) {
	count, replayed = map[string]int{}, map[string]*kgo.Record{}
	for _, r := range col.Records() {
		if r.Topic == kc.dlq() {
			continue
		}
		id := string(kafkatest.Header(r, "id"))
		count[id]++
		if kafkatest.Header(r, "walrelay.replay") != nil {
			replayed[id] = r
		}
	}
	return count, replayed
}

// TestLostSlotRunbook follows the runbook of docs/operations.md "The slot was lost or
// dropped": the slot dropped while walrelay is stopped and rows are
// written; run refuses and points at the tools; the slot created again;
// reconcile lists exactly the rows of the gap as missing (exit 2);
// reconcile --replay --yes sends them (exit 0); a second reconcile finds
// none (exit 0); every row is on the topic.
func TestLostSlotRunbook(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	p := streaming(t, e)
	before := newWriter(5, 41)
	if err := before.write(t.Context(), conn, 200, 10); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, before.written(), time.Minute)
	p.signal(syscall.SIGTERM)
	if code := p.exit(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if code, out := runCmd(t, e, "slot", "drop", "walrelay", "--yes"); code != 0 {
		t.Fatalf("slot drop: exit %d\n%s", code, out)
	}
	gap := newWriter(5, 42)
	if err := gap.write(t.Context(), conn, 150, 10); err != nil {
		t.Fatal(err)
	}
	if code, out := runCmd(t, e, "run"); code != 1 || !strings.Contains(lastLine(out), "walrelay reconcile --since") {
		t.Fatalf("run after the drop: exit %d, want the refusal naming reconcile:\n%s", code, tail(out, 2000))
	}
	mustRun(t, e, "slot", "create")
	p = streaming(t, e)
	after := newWriter(5, 43)
	if err := after.write(t.Context(), conn, 100, 10); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, after.written(), time.Minute)

	code, out := runCmd(t, e, "reconcile", "--since", "10m")
	if code != 2 {
		t.Fatalf("reconcile: exit %d:\n%s", code, out)
	}
	t.Logf("reconcile (exit 2):\n%s", out)
	code, out = runCmd(t, e, "reconcile", "--since", "10m", "--json")
	var doc struct {
		Rows, Found, Missing int
		MissingRows          []struct{ ID string } `json:"missing_rows"`
		SlotCaughtUp         bool                  `json:"slot_caught_up"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 2 {
		t.Fatalf("reconcile: exit %d, %v:\n%s", code, err, out)
	}
	want := map[string]bool{}
	for _, id := range gap.written() {
		want[id] = true
	}
	for _, m := range doc.MissingRows {
		if !want[m.ID] {
			t.Fatalf("reconcile lists %s as missing, which is not of the gap", m.ID)
		}
	}
	if doc.Missing != 150 || len(doc.MissingRows) != 150 || doc.Rows != 450 || doc.Found != 300 || !doc.SlotCaughtUp {
		t.Fatalf("reconcile: %+v, want the 150 rows of the gap missing of 450", doc)
	}
	code, out = runCmd(t, e, "reconcile", "--since", "10m", "--replay")
	if code != 2 || !strings.Contains(out, "would replay the 150 missing rows") {
		t.Fatalf("reconcile --replay without --yes: exit %d:\n%s", code, out)
	}
	code, out = runCmd(t, e, "reconcile", "--since", "10m", "--replay", "--yes")
	if code != 0 || !strings.Contains(out, "replayed the 150 missing rows") {
		t.Fatalf("reconcile --replay --yes: exit %d:\n%s", code, out)
	}
	t.Logf("reconcile --replay --yes:\n%s", tail(out, 600))
	all := append(append(before.written(), gap.written()...), after.written()...)
	c := waitAll(t, col, all, time.Minute)
	code, out = runCmd(t, e, "reconcile", "--since", "10m")
	if code != 0 || !strings.Contains(out, "450 on their topic, 0 dead-lettered, 0 missing") {
		t.Fatalf("the second reconcile: exit %d:\n%s", code, out)
	}
	t.Logf("the second reconcile: %s", out)
	_, replayed := onTopics(col, kc)
	if len(replayed) != 150 {
		t.Fatalf("%d records with walrelay.replay, want the gap's 150", len(replayed))
	}
	t.Logf("after the runbook: %s", c)
	p.signal(syscall.SIGTERM)
	p.exit(time.Minute)
}

// TestLostSlotRunbookRandomIDs: the runbook on a table written as the
// README's example writes it (gen_random_uuid ids) without the created_at
// column migrate gives it (a table of an older migrate, or dropped): run's
// refusal and reconcile's refusal of a time window name --all, and
// reconcile --all finds, replays (exit 0) and then no longer finds the
// rows of the gap.
func TestLostSlotRunbookRandomIDs(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	execSQL(t, conn, "ALTER TABLE outbox DROP COLUMN created_at")
	insert := func(n int, aggregate string) {
		t.Helper()
		if _, err := conn.Exec(t.Context(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
			SELECT gen_random_uuid(), 'order', $1 || i, 'OrderCreated', '{"total": 12.5}' FROM generate_series(1, $2) i`, aggregate, n); err != nil {
			t.Fatal(err)
		}
	}
	p := streaming(t, e)
	insert(20, "before-")
	waitfor.Until(t, time.Minute, "20 published", func() bool { c, _ := onTopics(col, kc); return len(c) == 20 })
	p.signal(syscall.SIGTERM)
	if code := p.exit(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if code, out := runCmd(t, e, "slot", "drop", "walrelay", "--yes"); code != 0 {
		t.Fatalf("slot drop: exit %d\n%s", code, out)
	}
	insert(15, "gap-")
	if code, out := runCmd(t, e, "run"); code != 1 || !strings.Contains(lastLine(out), "--all on a table without created_at, outbox.timestamp_column or only UUIDv7 ids") {
		t.Fatalf("run after the drop: exit %d, want the refusal naming reconcile --all:\n%s", code, tail(out, 2000))
	}
	mustRun(t, e, "slot", "create")
	p = streaming(t, e) // reconcile waits for the slot to confirm past its start
	if code, out := runCmd(t, e, "reconcile", "--since", "10m"); code != 1 || !strings.Contains(out, "--all") {
		t.Fatalf("reconcile --since on random ids: exit %d, want a refusal naming --all:\n%s", code, out)
	}
	code, out := runCmd(t, e, "reconcile", "--all")
	if code != 2 || !strings.Contains(out, "15 missing") {
		t.Fatalf("reconcile --all: exit %d, want the 15 rows of the gap missing:\n%s", code, out)
	}
	if code, out := runCmd(t, e, "reconcile", "--all", "--replay", "--yes"); code != 0 || !strings.Contains(out, "replayed the 15 missing rows") {
		t.Fatalf("reconcile --all --replay --yes: exit %d:\n%s", code, out)
	}
	waitfor.Until(t, time.Minute, "35 on the topic", func() bool { c, _ := onTopics(col, kc); return len(c) == 35 })
	if code, out := runCmd(t, e, "reconcile", "--all"); code != 0 || !strings.Contains(out, "0 missing") {
		t.Fatalf("the second reconcile --all: exit %d:\n%s", code, out)
	}
	p.signal(syscall.SIGTERM)
	p.exit(time.Minute)
}

// replayOrder returns, per aggregate id, the payloads' n of the records
// with the replay header, in the order the topic holds them, and how many
// records came after a record of their aggregate with a higher n.
func replayOrder(t *testing.T, col *kafkatest.Collector, kc *broker) (map[string][]int, int) {
	t.Helper()
	seqs, violations := map[string][]int{}, 0
	for _, r := range col.Records() {
		if r.Topic == kc.dlq() || kafkatest.Header(r, "walrelay.replay") == nil {
			continue
		}
		var v struct{ N int }
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("record %s: %v", r.Value, err)
		}
		k := string(r.Key)
		if s := seqs[k]; len(s) > 0 && s[len(s)-1] > v.N {
			violations++
		}
		seqs[k] = append(seqs[k], v.N)
	}
	return seqs, violations
}

// TestReplayKeepsAggregateOrder: rows with random ids and no timestamp,
// 120 of 5 aggregates in one transaction (one statement per row, then one
// statement of many rows) and then two transactions more, are replayed in
// the order they were committed, and replay says what the order rests on
// and that the table cannot tell commit order for sure; with
// outbox.order_column the column's order is the replay's.
func TestReplayKeepsAggregateOrder(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	n := map[string]int{} // the next n of each aggregate
	var sql strings.Builder
	row := func(agg string) string {
		v := fmt.Sprintf(`(gen_random_uuid(), 'order', '%s', 'T', '{"n": %d}')`, agg, n[agg])
		n[agg]++
		return v
	}
	insert := "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES "
	sql.WriteString("BEGIN;")
	for i := range 100 {
		sql.WriteString(insert + row(fmt.Sprintf("agg-%d", i*7%5)) + ";")
	}
	var many []string
	for i := range 20 {
		many = append(many, row(fmt.Sprintf("agg-%d", i%5)))
	}
	sql.WriteString(insert + strings.Join(many, ", ") + "; COMMIT;")
	for range 2 {
		sql.WriteString("BEGIN;")
		for i := range 20 {
			sql.WriteString(insert + row(fmt.Sprintf("agg-%d", i%5)) + ";")
		}
		sql.WriteString("COMMIT;")
	}
	execSQL(t, conn, sql.String())
	code, out := runCmd(t, e, "replay", "--all", "--yes")
	if code != 0 || !strings.Contains(out, "sent 160 rows") || !strings.Contains(out, "order: transaction id, then insert order") ||
		!strings.Contains(out, "note: an aggregate's rows may go out in another order than they were committed in: the table has no outbox.timestamp_column") {
		t.Fatalf("replay --all --yes: exit %d:\n%s", code, out)
	}
	waitfor.Until(t, time.Minute, "160 replayed", func() bool { _, r := onTopics(col, kc); return len(r) == 160 })
	if seqs, v := replayOrder(t, col, kc); v != 0 {
		t.Fatalf("%d order violations: %v", v, seqs)
	}

	// An order column whose order is not the insert order: the column's
	// order is the replay's.
	sql.Reset()
	sql.WriteString("ALTER TABLE outbox ADD COLUMN seq bigint; BEGIN;")
	for i := range 20 {
		sql.WriteString(fmt.Sprintf(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, seq) VALUES (gen_random_uuid(), 'late', 'late-%d', 'T', '{"n": %d}', %d);`, i%2, 19-i, 19-i))
	}
	sql.WriteString("COMMIT;")
	execSQL(t, conn, sql.String())
	code, out = runCmd(t, e.with("WALRELAY_OUTBOX_ORDER_COLUMN", "seq"), "replay", "--all", "--aggregate-type", "late", "--yes")
	if code != 0 || !strings.Contains(out, "sent 20 rows") || !strings.Contains(out, "order: outbox.order_column seq") || strings.Contains(out, "note:") {
		t.Fatalf("replay --all --yes with outbox.order_column: exit %d:\n%s", code, out)
	}
	waitfor.Until(t, time.Minute, "180 replayed", func() bool { _, r := onTopics(col, kc); return len(r) == 180 })
	if seqs, v := replayOrder(t, col, kc); v != 0 {
		t.Fatalf("%d order violations by outbox.order_column: %v", v, seqs)
	}
}

// TestReplayWindow: replay of a time window and an aggregate type sends
// exactly those rows again, with their headers and walrelay.replay; a dry
// run counts them and sends nothing.
func TestReplayWindow(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	streaming(t, e)
	write := func(aggType string, n int) []string {
		var ids []string
		for i := range n {
			id := outbox.NewID()
			execSQL(t, conn, fmt.Sprintf(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('%s', '%s', 'a-%d', 'Updated', '{"n": %d}')`, id, aggType, i%3, i))
			ids = append(ids, id)
		}
		return ids
	}
	old := append(write("order", 20), write("customer", 20)...)
	time.Sleep(50 * time.Millisecond)
	from := time.Now().UTC()
	time.Sleep(50 * time.Millisecond)
	orders, customers := write("order", 30), write("customer", 10)
	waitAll(t, col, append(append(old, orders...), customers...), time.Minute)
	records := len(col.Records())

	args := []string{"replay", "--since", from.Format(time.RFC3339Nano), "--aggregate-type", "order"}
	code, out := runCmd(t, e, args...)
	if code != 0 || !strings.Contains(out, "would send 30 rows") || !regexp.MustCompile(`outbox\.event\.order\s+30`).MatchString(out) {
		t.Fatalf("replay dry run: exit %d:\n%s", code, out)
	}
	time.Sleep(300 * time.Millisecond)
	if n := len(col.Records()); n != records {
		t.Fatalf("the dry run sent %d records", n-records)
	}
	code, out = runCmd(t, e, append(args, "--yes")...)
	if code != 0 || !strings.Contains(out, "sent 30 rows") {
		t.Fatalf("replay --yes: exit %d:\n%s", code, out)
	}
	waitfor.Until(t, time.Minute, "the 30 replayed records", func() bool { _, r := onTopics(col, kc); return len(r) == 30 })
	time.Sleep(300 * time.Millisecond)
	count, replayed := onTopics(col, kc)
	for _, id := range orders {
		r := replayed[id]
		if count[id] != 2 || r == nil || string(kafkatest.Header(r, "type")) != "Updated" || r.Topic != kc.topic("order") || !strings.HasPrefix(string(r.Value), `{"n": `) {
			t.Fatalf("event %s: %d records, replayed %+v", id, count[id], r)
		}
	}
	for _, id := range append(old, customers...) {
		if count[id] != 1 {
			t.Fatalf("event %s outside the window: %d records", id, count[id])
		}
	}
	t.Logf("replay --yes: %s", lastLine(out))
}

// TestDLQReplay: a payload over the topic's max.message.bytes is
// dead-lettered; dlq list shows it; after the limit is raised, dlq replay
// sends it to its topic, and a second dlq replay sends nothing; one whose
// topic's limit was not raised fails again and stays dead-lettered with
// its new error.
func TestDLQReplay(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	for _, agg := range []string{"order", "customer"} {
		createTopic(t, kc.Addrs(), kc.topic(agg), map[string]string{"max.message.bytes": "30000"})
	}
	e := baseEnv(pg, kc)
	streaming(t, e)
	big := func(agg string) string {
		id := outbox.NewID()
		execSQL(t, conn, fmt.Sprintf(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('%s', '%s', 'a-1', 'Big', '{"pad": "%s"}')`, id, agg, strings.Repeat("x", 40000)))
		return id
	}
	orderID, customerID := big("order"), big("customer")
	waitfor.Until(t, time.Minute, "two dead letters", func() bool {
		n := 0
		for _, r := range col.Records() {
			if r.Topic == kc.dlq() {
				n++
			}
		}
		return n == 2
	})
	code, out := runCmd(t, e, "dlq", "list", "--reason", "too_large")
	if code != 0 || !strings.Contains(out, orderID) || !strings.Contains(out, customerID) || !strings.Contains(out, kc.topic("order")) {
		t.Fatalf("dlq list: exit %d:\n%s", code, out)
	}
	t.Logf("dlq list:\n%s", out)
	if code, out := runCmd(t, e, "dlq", "show", orderID); code != 0 || !strings.Contains(out, "reason:         too_large") {
		t.Fatalf("dlq show: exit %d:\n%s", code, out)
	}
	alterTopic(t, kc.Addrs(), kc.topic("order"), "max.message.bytes", "1000000")
	code, out = runCmd(t, e, "dlq", "replay", "--all", "--yes")
	if code != 0 || !strings.Contains(out, "replayed 2 dead letters: 1 reached their topic") || !strings.Contains(out, "1 failed again") {
		t.Fatalf("dlq replay: exit %d:\n%s", code, out)
	}
	t.Logf("dlq replay: %s", out)
	waitfor.Until(t, time.Minute, "the order on its topic", func() bool { c, _ := onTopics(col, kc); return c[orderID] == 1 })
	code, out = runCmd(t, e, "dlq", "replay", "--all", "--yes")
	if code != 0 || !strings.Contains(out, "replayed 1 dead letters: 0 reached their topic") || !strings.Contains(out, "2 replayed before, skipped") {
		t.Fatalf("the second dlq replay (only the new dead letter of the customer): exit %d:\n%s", code, out)
	}
	time.Sleep(300 * time.Millisecond)
	if c, _ := onTopics(col, kc); c[orderID] != 1 || c[customerID] != 0 {
		t.Fatalf("after two replays: order %d records, customer %d", c[orderID], c[customerID])
	}
	code, out = runCmd(t, e, "dlq", "list", "--json")
	var rows []struct {
		ID       string
		Replayed bool
		Error    string
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil || code != 0 {
		t.Fatalf("dlq list --json: exit %d, %v:\n%s", code, err, out)
	}
	pending := 0
	for _, r := range rows {
		if !r.Replayed {
			pending++
			if r.ID != customerID || !strings.Contains(r.Error, "MESSAGE_TOO_LARGE") {
				t.Fatalf("a dead letter not replayed: %+v", r)
			}
		}
	}
	if pending != 1 {
		t.Fatalf("%d dead letters not replayed, want the customer's: %s", pending, out)
	}
}

// TestDeadLetterOfAWideKey: a row whose aggregate id (a text column of
// 200,000 bytes, within postgres.max_message_bytes) is over the batch cap
// (kafka.batch_max_bytes 65536), a tombstone (no value to omit) deleted
// in its transaction, is
// dead-lettered too_large with its id and without its key
// (walrelay.key_headers_omitted_bytes), and walrelay moves on to the next
// row; before, the dead letter carried the key, the client refused it as
// too large, retriably, and walrelay restarted on the row for ever. dlq
// replay names it not replayable (its row gone, its key left out) rather
// than send it without its key, to another partition.
func TestDeadLetterOfAWideKey(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	execSQL(t, conn, `ALTER TABLE outbox ALTER COLUMN aggregateid TYPE text`)
	e := baseEnv(pg, kc).with("WALRELAY_KAFKA_BATCH_MAX_BYTES", "65536")
	streaming(t, e)
	wide, next := outbox.NewID(), outbox.NewID()
	execSQL(t, conn, fmt.Sprintf(`BEGIN; INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('%[1]s', 'order', repeat('k', 200000), 'Wide', NULL); DELETE FROM outbox WHERE id = '%[1]s'; COMMIT`, wide),
		fmt.Sprintf(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('%s', 'order', 'a-1', 'Next', '{}')`, next))
	var dl *kgo.Record
	waitfor.Until(t, time.Minute, "the wide row dead-lettered and the next one on its topic", func() bool {
		c, _ := onTopics(col, kc)
		for _, r := range col.Records() {
			if r.Topic == kc.dlq() && sink.Header(r, "id") == wide {
				dl = r
			}
		}
		return dl != nil && c[next] == 1
	})
	if sink.Header(dl, sink.HeaderReason) != "too_large" || dl.Key != nil || sink.Header(dl, sink.HeaderKeyHeadersOmitted) != "200000" {
		t.Fatalf("dead letter: reason %q, key %d bytes, %s %q; want too_large, no key, 200000",
			sink.Header(dl, sink.HeaderReason), len(dl.Key), sink.HeaderKeyHeadersOmitted, sink.Header(dl, sink.HeaderKeyHeadersOmitted))
	}
	code, out := runCmd(t, e, "dlq", "replay", "--all", "--yes")
	if code != 0 || !strings.Contains(out, "reached their topic") || !strings.Contains(out, "not replayable: "+wide) {
		t.Fatalf("dlq replay: exit %d:\n%s", code, out)
	}
	time.Sleep(300 * time.Millisecond)
	if c, _ := onTopics(col, kc); c[wide] != 0 {
		t.Fatalf("dlq replay sent the dead letter without its key: %d records of %s", c[wide], wide)
	}
}

// TestPrune: on a table of many old rows (WALRELAY_PRUNE_ROWS, default
// 100,000) while walrelay streams new ones, prune refuses while walrelay is
// stopped and rows are unconfirmed, then deletes every old row in batches
// and no new one; the stream is not disturbed.
func TestPrune(t *testing.T) {
	long(t)
	t.Parallel()
	rows := 100000
	if n, err := strconv.Atoi(os.Getenv("WALRELAY_PRUNE_ROWS")); err == nil && n > 0 {
		rows = n
	}
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	// Old rows: UUIDv7 ids and created_at of three hours ago.
	oldRows := func(n int, tag string) {
		execSQL(t, conn, fmt.Sprintf(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
			SELECT (lpad(to_hex((extract(epoch FROM now() - interval '3 hours') * 1000)::bigint), 12, '0') || '7' || substr(md5('%[2]s' || i), 1, 3) || '8' || substr(md5('%[2]s' || i), 4, 15))::uuid,
			'old', 'a-' || (i %% 100), 'Old', '{}', now() - interval '3 hours' FROM generate_series(1, %[1]d) i`, n, tag))
	}
	oldRows(rows, "a")
	p := streaming(t, e)
	count := func(where string) int {
		var n int
		if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM outbox WHERE "+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var end string
	if err := conn.QueryRow(t.Context(), "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 5*time.Minute, "the old rows confirmed", func() bool {
		var done bool
		if err := conn.QueryRow(t.Context(), "SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'walrelay'", end).Scan(&done); err != nil {
			t.Fatal(err)
		}
		return done
	})
	p.signal(syscall.SIGTERM)
	p.exit(time.Minute)
	oldRows(10, "b") // committed while walrelay is stopped: not confirmed
	code, out := runCmd(t, e, "prune", "--older-than", "1h", "--wait", "2s", "--yes")
	if code != 1 || !strings.Contains(out, "prune deletes only rows walrelay confirmed") || count("aggregatetype = 'old'") != rows+10 {
		t.Fatalf("prune with unconfirmed rows: exit %d, %d old rows left:\n%s", code, count("aggregatetype = 'old'"), out)
	}
	p = streaming(t, e)
	w := newWriter(10, 44)
	stop := w.keepWriting(t.Context(), pg.DSN)
	code, out = runCmd(t, e, "prune", "--older-than", "1h")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("would delete %d rows", rows+10)) {
		t.Fatalf("prune dry run: exit %d:\n%s", code, out)
	}
	code, out = runCmd(t, e, "prune", "--older-than", "1h", "--yes", "--json")
	var doc struct {
		RowsDeleted  int     `json:"rows_deleted"`
		Batches      int     `json:"batches"`
		Seconds      float64 `json:"seconds"`
		LongestBatch float64 `json:"longest_batch_seconds"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 || doc.RowsDeleted != rows+10 {
		t.Fatalf("prune --yes: exit %d, %v:\n%s", code, err, out)
	}
	time.Sleep(500 * time.Millisecond)
	if n := stop(); n != 0 {
		t.Fatalf("%d writes failed", n)
	}
	c := waitAll(t, col, w.written(), time.Minute)
	if left := count("aggregatetype = 'old'"); left != 0 {
		t.Fatalf("%d old rows left", left)
	}
	if n := count("aggregatetype = 'order'"); n != len(w.written()) {
		t.Fatalf("%d new rows in the table, want all %d", n, len(w.written()))
	}
	t.Logf("prune of %d rows: %d batches in %.1f s (%.0f rows/s), the longest batch %.0f ms; the stream meanwhile (the old rows' own events count as unexpected): %s",
		doc.RowsDeleted, doc.Batches, doc.Seconds, float64(doc.RowsDeleted)/doc.Seconds, doc.LongestBatch*1000, c)
	p.signal(syscall.SIGTERM)
	p.exit(time.Minute)
}

// TestRecoveryRefusesBadInput: a window that ends before it starts, an
// unknown reason, an --ids file with a malformed id, and a time window on
// a table whose ids are not UUIDv7 and that has no timestamp column nor
// created_at: one
// clear line each, exit 1, nothing sent.
func TestRecoveryRefusesBadInput(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	idsFile := filepath.Join(t.TempDir(), "ids")
	if err := os.WriteFile(idsFile, []byte(outbox.NewID()+"\n# a comment\nnot-an-id\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	execSQL(t, conn, "ALTER TABLE outbox DROP COLUMN created_at",
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', 'a', 'T', '{}')`)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "--since", "1h", "--until", "2h"}, "the window ends"},
		{[]string{"reconcile", "--since", "yesterday"}, `--since "yesterday": want RFC 3339`},
		{[]string{"dlq", "list", "--reason", "sunspots"}, `--reason "sunspots": unknown`},
		{[]string{"replay", "--ids", idsFile, "--yes"}, `id "not-an-id" is not a UUID`},
		{[]string{"replay", "--since", "1h", "--yes"}, "time windows need a created_at column (walrelay migrate adds it), outbox.timestamp_column or UUIDv7 ids: the ids of public.outbox are not all UUIDv7"},
		{[]string{"replay", "--since", "1h", "--all"}, "give one of --since (with --until), --ids FILE or --all"},
		{[]string{"prune", "--older-than", "5m", "--yes"}, "prune keeps at least 1h0m0s"},
		{[]string{"replay", "--all", "--yes", "--outbox.timestamp_column", "type"}, `column "type" of public.outbox is character varying(255), not a timestamp`},
		{[]string{"replay", "--all", "--yes", "--outbox.order_column", "seq"}, `outbox.order_column: table public.outbox has no column "seq"`},
	} {
		code, out := runCmd(t, e, c.args...)
		if code != 1 || !strings.Contains(lastLine(out), c.want) || strings.Count(strings.TrimSpace(out), "\n") != 0 {
			t.Fatalf("%v: exit %d, want one line with %q:\n%s", c.args, code, c.want, out)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if n := len(col.Records()); n != 0 {
		t.Fatalf("%d records sent by refused commands", n)
	}
}

// TestRecoveryAtScale runs reconcile and replay over a window of many rows
// (WALRELAY_RECOVERY_ROWS, default 20,000; docs/benchmarks.md's figures are of
// 1,000,000, without -race) and reports rows/s and peak RSS: both stream
// the window, so memory does not grow with it.
func TestRecoveryAtScale(t *testing.T) {
	long(t)
	t.Parallel()
	rows := 20000
	if n, err := strconv.Atoi(os.Getenv("WALRELAY_RECOVERY_ROWS")); err == nil && n > 0 {
		rows = n
	}
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	p := streaming(t, e)
	execSQL(t, conn, fmt.Sprintf(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7' || substr(md5(i::text), 1, 3) || '8' || substr(md5(i::text), 4, 15))::uuid,
		'order', 'a-' || (i %% 1000), 'Created', jsonb_build_object('n', i, 'pad', repeat('x', 200)) FROM generate_series(1, %d) i`, rows))
	waitfor.Until(t, 10*time.Minute, "every row on the topic", func() bool { return len(col.Records()) >= rows })
	p.signal(syscall.SIGTERM)
	p.exit(time.Minute)
	measure := func(args ...string) (float64, int64, string) {
		q := start(t, e, args...)
		// VmHWM, sampled while it runs: the rusage of a child counts the
		// parent's resident set at the fork (this test holds every record).
		var rss int64
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				if r := q.peakRSS(); r > rss {
					rss = r
				}
				select {
				case <-q.done:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
		code := q.exit(30 * time.Minute)
		<-sampled
		if code != 0 && code != 2 {
			t.Fatalf("%v: exit %d:\n%s", args, code, tail(q.out.String(), 2000))
		}
		var doc struct{ Seconds float64 }
		if err := json.Unmarshal([]byte(q.out.String()), &doc); err != nil {
			t.Fatalf("%v: %v:\n%s", args, err, tail(q.out.String(), 2000))
		}
		return doc.Seconds, rss, q.out.String()
	}
	secs, rss, out := measure("reconcile", "--since", "1h", "--json", "--wait", "5s")
	if !strings.Contains(out, fmt.Sprintf(`"found": %d`, rows)) || !strings.Contains(out, `"missing": 0`) {
		t.Fatalf("reconcile:\n%s", tail(out, 2000))
	}
	t.Logf("reconcile of %d rows: %.1f s, %.0f rows/s, peak RSS %.1f MiB", rows, secs, float64(rows)/secs, float64(rss)/(1<<20))
	secs, rss, out = measure("replay", "--since", "1h", "--json")
	if !strings.Contains(out, fmt.Sprintf(`"rows": %d`, rows)) || !strings.Contains(out, `"dry_run": true`) {
		t.Fatalf("replay dry run:\n%s", tail(out, 2000))
	}
	t.Logf("replay, dry run, of %d rows: %.1f s, %.0f rows/s, peak RSS %.1f MiB", rows, secs, float64(rows)/secs, float64(rss)/(1<<20))
	secs, rss, out = measure("replay", "--since", "1h", "--yes", "--json")
	if !strings.Contains(out, fmt.Sprintf(`"rows": %d`, rows)) {
		t.Fatalf("replay:\n%s", tail(out, 2000))
	}
	t.Logf("replay of %d rows: %.1f s, %.0f rows/s, peak RSS %.1f MiB", rows, secs, float64(rows)/secs, float64(rss)/(1<<20))
}

// TestReconcileRefusesTrimmedTopics: on a compacted topic a record
// superseded by a later one of its key is gone, so its row counts as
// missing, and replaying it would make an old event its key's latest value
// (which compaction then keeps); on a topic whose log starts after offset 0
// (retention, a deletion), rows of the window published before it count as
// missing too. reconcile warns of both, and reconcile --replay refuses.
// Before, it replayed the rows.
func TestReconcileRefusesTrimmedTopics(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	insert := func(aggType string) {
		t.Helper()
		if _, err := conn.Exec(t.Context(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
			SELECT gen_random_uuid(), $1, 'k' || i, 'T', '{}' FROM generate_series(1, 3) i`, aggType); err != nil {
			t.Fatal(err)
		}
	}
	createTopic(t, kc.Addrs(), kc.topic("order"), map[string]string{"cleanup.policy": "compact"})
	insert("order")
	code, out := runCmd(t, e, "reconcile", "--all", "--wait", "1s")
	if code != 2 || !strings.Contains(out, "cleanup.policy") {
		t.Fatalf("reconcile on a compacted topic: exit %d, want 2 and a warning naming cleanup.policy:\n%s", code, out)
	}
	code, out = runCmd(t, e, "reconcile", "--all", "--wait", "1s", "--replay", "--yes")
	if code != 1 || !strings.Contains(out, "cleanup.policy") || strings.Contains(out, "replayed the") {
		t.Fatalf("reconcile --replay on a compacted topic: exit %d, want a refusal naming cleanup.policy:\n%s", code, out)
	}

	// A topic whose partition 0 starts at offset 1.
	if _, err := conn.Exec(t.Context(), "DELETE FROM outbox"); err != nil {
		t.Fatal(err)
	}
	createTopic(t, kc.Addrs(), kc.topic("invoice"), nil)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for range 2 {
		if err := cl.ProduceSync(t.Context(), &kgo.Record{Topic: kc.topic("invoice"), Partition: 0, Value: []byte("{}")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	adm := kadm.NewClient(cl)
	var del kadm.Offsets
	del.Add(kadm.Offset{Topic: kc.topic("invoice"), Partition: 0, At: 1})
	if _, err := adm.DeleteRecords(t.Context(), del); err != nil {
		t.Fatal(err)
	}
	insert("invoice")
	code, out = runCmd(t, e, "reconcile", "--all", "--wait", "1s", "--replay", "--yes")
	if code != 1 || !strings.Contains(out, "starts at offset 1") || strings.Contains(out, "replayed the") {
		t.Fatalf("reconcile --replay on a topic that starts at offset 1: exit %d, want a refusal naming it:\n%s", code, out)
	}
}
