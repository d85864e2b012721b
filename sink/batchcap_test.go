package sink

import (
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// TestBatchCapLearntAgainKeepsOneBatch: a client keeps the batch cap it
// asked for when it first loaded a partition (ProducerBatchMaxBytesFn), so a
// round measures a partition's records by the smallest cap a client was
// given (roundCapOf), not by the cap the sink knows now: else it hands the
// client more than one of the client's batches between flushes, and the
// partition's records go in several produce requests in flight at once.
// They differ when the sink forgets a topic (past 4096 topics) and learns
// it again after its max.message.bytes was raised: here the topic's cap is
// 16 KiB when the lane's client loads it, and 256 KiB when it is learnt
// again.
func TestBatchCapLearntAgainKeepsOneBatch(t *testing.T) {
	t.Parallel()
	for _, exactlyOnce := range []bool{false, true} {
		t.Run(fmt.Sprint("exactly_once=", exactlyOnce), func(t *testing.T) {
			t.Parallel()
			batchCapRelearnt(t, exactlyOnce)
		})
	}
}

func batchCapRelearnt(t *testing.T, exactlyOnce bool) {
	const topic, n = "outbox.event.order", 400
	kc := kafkatest.Start(t, kfake.SeedTopics(1, topic))
	h := &inflightHook{}
	cfg := Config{BatchMaxBytes: 256 << 10, MaxBufferedBytes: 8 << 20, MaxBufferedRecords: 100000, ProducerOpts: []kgo.Opt{kgo.WithHooks(h)}}
	if exactlyOnce {
		cfg.Transactions = &Transactions{ID: "walrelay-probe-cap", Key: "slot_a", Source: "db"}
	}
	s := newSink(t, kc, cfg)
	if exactlyOnce {
		if err := s.Ping(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := s.Resume(t.Context(), onTimeline1); err != nil {
			t.Fatal(err)
		}
	}
	// The topic's max.message.bytes is 16 KiB when the sink learns it.
	s.topics.Store(topic, topicInfo{valid: true, batchCap: 16 << 10})
	s.topicsN.Add(1)
	for _, id := range []string{"warm0", "warm1"} { // the lane of no broker's client, then broker 0's
		if err := publish(t, s, newEvent(id)); err != nil {
			t.Fatal(err)
		}
	}
	// Forgotten (4096 other topics came by) and learnt again after the
	// operator raised max.message.bytes: the lanes' clients keep 16 KiB.
	s.topics.Store(topic, topicInfo{valid: true, batchCap: 256 << 10})
	_, most := publishSlowed(t, s, kc, h, n)
	if most > 1 {
		t.Fatalf("one partition's records went in %d produce requests in flight at once: the lane counted batches of 256 KiB, its client cut them at 16 KiB", most)
	}
}

// TestProbeRelayUnderChurn runs the sink as the relay does (events in
// order, a window in flight; at a failure: wait, Abort, publish again from
// the first failed event) while, at once, idle lanes are retired as if
// their brokers left and came back, the sink breaks at random moments (as
// at a record's failure, racing the lanes' rounds), and the topic gains
// partitions (6 -> 12) with one lane's client refreshed first.
// (Abort at random moments is replaced by the sink broken at random
// moments: see relayUnderChurn.) Judged from
// the topic: per key, in each partition, events in increasing order; a key
// in at most two partitions, every event in the first before every one in

// TestProduceRequestHoldsOneBatch: a produce request holds about one
// batch (BatchMaxBytes and the request's own fields), not one batch of
// every partition of the broker: the client encodes each request into a
// buffer of its size, grown by doubling, and after a collection empties
// its pool, grows one again for each request; with 64 KiB payloads that
// compression does not shrink, four partitions' batches of 1 MB made
// requests of 4 MB, and the buffers and their growth were a quarter of
// walrelay's heap and a third of its CPU under the default soft memory
// limit (docs/benchmarks.md).
func TestProduceRequestHoldsOneBatch(t *testing.T) {
	t.Parallel()
	for _, exactlyOnce := range []bool{false, true} {
		t.Run(fmt.Sprint("exactly_once=", exactlyOnce), func(t *testing.T) {
			t.Parallel()
			const topic, batch = "outbox.event.order", 128 << 10
			kc := kafkatest.Start(t, kfake.SeedTopics(4, topic))
			h := &inflightHook{}
			cfg := Config{BatchMaxBytes: batch, MaxBufferedBytes: 8 << 20, Compression: "none", ProducerOpts: []kgo.Opt{kgo.WithHooks(h)}}
			if exactlyOnce {
				cfg.Transactions = &Transactions{ID: "walrelay-probe-request", Key: "slot_a", Source: "db"}
			}
			s := newSink(t, kc, cfg)
			if exactlyOnce {
				if err := s.Ping(t.Context()); err != nil {
					t.Fatal(err)
				}
				if err := s.Resume(t.Context(), onTimeline1); err != nil {
					t.Fatal(err)
				}
			}
			publishSlowedOf(t, s, kc, h, 400, 16<<10, 16)
			h.mu.Lock()
			defer h.mu.Unlock()
			t.Logf("largest produce request %d bytes (batches of %d)", h.largest, batch)
			if h.largest > int(requestCap(batch)) {
				t.Fatalf("a produce request of %d bytes, over %d: it held the batches of several partitions", h.largest, requestCap(batch))
			}
		})
	}
}
