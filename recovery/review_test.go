package recovery

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
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
