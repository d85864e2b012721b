package recovery

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/sink"
)

// TestTrimmedCheckDoesNotTrustTimestampOrder: walrelay stamps a record
// with its event's time, not the time it was published, so a partition's
// timestamps are not in offset order (a row the poll source retried late,
// a dlq replay, a replay). Offset 0 is an event of the window (since+1m),
// offset 1 an event from before the window published late, offset 2 the
// window's next event; the records before offset 1 are deleted. The
// window's event at offset 0 is gone: trimmedTopics names the partition,
// so reconcile --replay refuses. Before, the first record at or after
// since being at offset 2, after the log's start, it took the deleted
// records for older than the window and said nothing.
func TestTrimmedCheckDoesNotTrustTimestampOrder(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	opts := []kgo.Opt{kgo.SeedBrokers(kc.Addrs()...)}
	cl, err := kgo.NewClient(append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.AllowAutoTopicCreation())...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const topic = "outbox.event.order"
	since := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	for _, ts := range []time.Time{since.Add(time.Minute), since.Add(-time.Hour), since.Add(2 * time.Minute)} {
		if err := cl.ProduceSync(t.Context(), &kgo.Record{Topic: topic, Partition: 0, Value: []byte("{}"), Timestamp: ts}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	adm := kadm.NewClient(cl)
	var del kadm.Offsets
	del.Add(kadm.Offset{Topic: topic, Partition: 0, At: 1})
	if _, err := adm.DeleteRecords(t.Context(), del); err != nil {
		t.Fatal(err)
	}
	notes, err := trimmedTopics(t.Context(), opts, []string{topic}, since)
	if err != nil {
		t.Fatal(err)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "partition 0 starts at offset 1") {
		t.Fatalf("the record of the window at offset 0 (since+1m) was deleted (the log starts at offset 1, whose record is stamped since-1h): trimmedTopics says %q, want the partition named", notes)
	}
}

// TestPruneNamesALostSlot: a slot the server invalidated (wal_status
// lost) never confirms again; prune refuses naming that cause and the way
// out, not asking whether walrelay runs.
func TestPruneNamesALostSlot(t *testing.T) {
	t.Parallel()
	const slot = "prune_lost"
	_, conn, tb := pruneFixture(t, 5, slot)
	ctx := t.Context()
	for _, sql := range []string{
		"ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "ALTER SYSTEM SET max_wal_size = '32MB'", "ALTER SYSTEM SET min_wal_size = '32MB'",
		"SELECT pg_reload_conf()",
		"CREATE TABLE busy AS SELECT repeat('z', 1000) AS pad FROM generate_series(1, 40000)",
		"SELECT pg_switch_wal()", "CHECKPOINT",
		"INSERT INTO busy SELECT repeat('y', 1000) FROM generate_series(1, 40000)",
		"SELECT pg_switch_wal()", "CHECKPOINT",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	var status string
	if err := conn.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "lost" {
		t.Fatalf("could not invalidate the slot for the test: wal_status %s", status)
	}
	_, err := (&Pruner{Table: tb, Slot: slot, Wait: time.Second}).Run(ctx, time.Hour)
	if err == nil || !strings.Contains(err.Error(), "wal_status lost") || strings.Contains(err.Error(), "is walrelay running") {
		t.Fatalf("prune with a lost slot: %v, want a refusal naming the lost slot", err)
	}
}

// TestReconcileOfACutDeadLetterID: a dead letter whose id was cut
// (sink.HeaderIDOmitted) holds a prefix of its row's id. dlq replay skips
// it; reconcile took the prefix as an id: the dead-lettered row (its
// whole id) counted missing and --replay republished it, and a row whose
// id is the prefix, never sent, counted dead-lettered, its loss hidden
// (before: Missing 1 the whole id, republished; DeadLettered 1). Now the
// prefix is no id: the row it may name is counted IDCut, not replayed,
// and the prefix's own row is missing.
func TestReconcileOfACutDeadLetterID(t *testing.T) {
	ctx := t.Context()
	conn := migratedConn(t)
	prefix := strings.Repeat("p", 1000)
	whole := prefix + strings.Repeat("q", 70000) // dead-lettered, its id cut to prefix
	longer := whole + "r"                        // sent nowhere, not of the cut id's length
	for _, stmt := range []string{`ALTER TABLE outbox ALTER COLUMN id TYPE text`,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + whole + `', 'order', 'a-1', 'Big', '{}')`,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + prefix + `', 'order', 'a-2', 'Other', '{}')`,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + longer + `', 'order', 'a-3', 'Other', '{}')`} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	tb, err := Open(ctx, conn, decoder.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	cl, opts := dlqProducer(t)
	dl := &kgo.Record{Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(prefix)}, {Key: sink.HeaderReason, Value: []byte("invalid_event")},
		{Key: sink.HeaderTopic, Value: []byte("outbox.event.order")}, {Key: sink.HeaderIDOmitted, Value: []byte("70000")}}}
	if err := cl.ProduceSync(ctx, dl).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// The topic the rows route to exists, without them.
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "outbox.event.order", Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	p := &recordingPublisher{}
	var missing []string
	rc := &Reconciler{Table: tb, Publisher: p, Kafka: opts, DLQTopic: "walrelay.dlq", Wait: time.Second, Replay: true,
		OnMissing: func(r Row) { missing = append(missing, r.Event.ID) }}
	res, err := rc.Run(ctx, Window{All: true})
	if err != nil {
		t.Fatal(err)
	}
	name := func(ids []string) []string {
		out := make([]string, len(ids))
		for i, id := range ids {
			switch id {
			case prefix:
				out[i] = "prefix"
			case whole:
				out[i] = "whole"
			case longer:
				out[i] = "longer"
			default:
				out[i] = fmt.Sprintf("another (%d bytes)", len(id))
			}
		}
		return out
	}
	slices.Sort(missing)
	slices.Sort(p.ids)
	t.Logf("found %d, dead-lettered %d, id cut %d, missing %d %v; republished %v", res.Found, res.DeadLettered, res.IDCut, res.Missing, name(missing), name(p.ids))
	if res.DeadLettered != 0 || res.IDCut != 1 || res.Missing != 2 {
		t.Errorf("dead-lettered %d, id cut %d, missing %d, want 0, 1 (the whole id), 2 (the prefix and the longer id)", res.DeadLettered, res.IDCut, res.Missing)
	}
	if got := name(missing); !slices.Equal(got, []string{"prefix", "longer"}) {
		t.Errorf("missing %v, want the prefix and the longer id", got)
	}
	if got := name(p.ids); !slices.Equal(got, []string{"prefix", "longer"}) {
		t.Errorf("--replay republished %v, want the prefix and the longer id (not the row whose dead letter's id was cut)", got)
	}
}
