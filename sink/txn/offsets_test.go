package txn

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/sink/produce"
)

// onTimeline1 is a database's WAL history on its first timeline, past
// every position of the tests.
var onTimeline1 = event.WALHistory{SystemID: "test", Timeline: 1, Flushed: 1 << 40}

// TestOffsetsStartMeasure measures what reading the committed position
// costs at start with WALRELAY_BENCH_OFFSETS positions on the offsets topic
// (skipped without it), against a real Apache Kafka broker with
// WALRELAY_TEST_KAFKA=real, else kfake. Two offsets topics are filled:
// one as walrelay creates it (16 MiB segments) and one of the broker's
// default segment size, as walrelay created it before. On each, the read
// back from a marker (readCommitted, as Resume does it) is timed beside
// the read from the topic's start to a marker that walrelay did before, in
// the same run, the producer already initialised. The positions are
// produced by a plain producer, one uncompressed record per batch as a
// transaction writes them, faster than a million transactions could be; a
// transaction's commit marker would add a control batch to each.
func TestOffsetsStartMeasure(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("WALRELAY_BENCH_OFFSETS"))
	if n <= 0 {
		t.Skip("set WALRELAY_BENCH_OFFSETS to the number of positions")
	}
	var addrs []string
	if os.Getenv(kafkatest.EnvKafka) == "real" {
		addrs = kafkatest.StartReal(t).Addrs()
	} else {
		addrs = kafkatest.Start(t).Addrs()
	}
	// The names are as long as a production database's: one record fills
	// more than half a batch of 512 bytes.
	const id, slot, source = "walrelay-7312345678901234567-orders_production-walrelay_orders", "walrelay_orders", "7312345678901234567/orders_production"
	for _, topic := range []string{"walrelay.offsets", "walrelay.offsets.default-segments"} {
		tc := Config{ID: id, Key: slot, Source: source, OffsetsTopic: topic}
		// The producer as package sink makes it, with the sink's default
		// buffers, and a queue of its own.
		q := produce.NewQueue(5000, 16<<20, 1000012)
		s, err := New(tc, q, slog.New(slog.DiscardHandler), Clients{Brokers: addrs, ClientID: "walrelay", Base: []kgo.Opt{kgo.SeedBrokers(addrs...)}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		// Nothing is queued: Resume's first call does not abort anyway.
		abort := func(context.Context) error { return nil }
		configs := offsetsTopicConfigs
		if topic != "walrelay.offsets" {
			// As walrelay created it before: compacted, the broker's segments.
			configs = map[string]string{"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
		}
		err = s.ensureOffsetsTopic(t.Context(), configs)
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		for err := s.Resume(t.Context(), onTimeline1, abort); err != nil; err = s.Resume(t.Context(), onTimeline1, abort) {
			if failure.IsFatal(err) || time.Since(began) > 2*time.Minute {
				t.Fatal(err)
			}
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
			// One uncompressed record per batch, as each transaction writes it.
			kgo.ProducerBatchMaxBytes(512), kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.MaxBufferedRecords(100000))
		if err != nil {
			t.Fatal(err)
		}
		fill := time.Now()
		var failed atomic.Value
		for i := range n {
			v := fmt.Sprintf(`{"slot":%q,"source":%q,"commit_lsn":%q,"index":0,"timeline":1,"transactional_id":%q,"committed_at":"2026-12-04T00:00:00.123456789Z"}`,
				slot, source, pglogrepl.LSN(0x100+i), id)
			cl.Produce(t.Context(), &kgo.Record{Key: []byte(slot), Value: []byte(v)}, func(_ *kgo.Record, err error) {
				if err != nil {
					failed.Store(err)
				}
			})
		}
		if err := cl.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
		cl.Close()
		if err := failed.Load(); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d positions produced in %s", topic, n, time.Since(fill).Round(time.Millisecond))

		began = time.Now()
		if err := s.readCommitted(t.Context()); err != nil {
			t.Fatal(err)
		}
		back := time.Since(began)
		if got, want := s.Committed(), (event.Position{CommitLSN: pglogrepl.LSN(0x100 + n - 1)}); got != want {
			t.Fatalf("read %s, want %s", got, want)
		}
		began = time.Now()
		at, err := s.writeMarker(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		last, read, _, err := s.readOffsets(t.Context(), 0, at, -1)
		if err != nil || last == nil {
			t.Fatalf("the read from the start: %v (found %v)", err, last != nil)
		}
		whole := time.Since(began)
		t.Logf("%s, %d positions: the read back from the marker %s (%d records); the read from the start %s (%d records); ratio %.1f",
			topic, n, back.Round(time.Millisecond), s.readLast, whole.Round(time.Millisecond), read, float64(whole)/float64(back))
	}
}
