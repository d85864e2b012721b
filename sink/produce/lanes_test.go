package produce

import (
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// inflight counts the produce requests a client has written and not yet
// read the answer of, and keeps the highest count.
type inflight struct {
	mu              sync.Mutex
	now, most, reqs int
}

func (h *inflight) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.Produce) && err == nil {
		h.mu.Lock()
		h.now++
		h.reqs++
		h.most = max(h.most, h.now)
		h.mu.Unlock()
	}
}

func (h *inflight) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, _ error) {
	if key == int16(kmsg.Produce) {
		h.mu.Lock()
		h.now = max(h.now-1, 0)
		h.mu.Unlock()
	}
}

// TestLaneOfNoBrokerOneBatchPerPartition (issue 48 item 2): in the lane of
// no broker, a topic's first keyed records (partition not known yet, -1:
// the lane's client partitions them) and the next ones of the same key
// (partition 0, once the count is known, following them into that lane)
// land in one partition, so a lane must count them together against the
// batch cap. Here 10 of each, of 1 KiB, in one round, under a 16 KiB batch
// cap, every answer 100 ms late: counted apart, each half fits a batch, the
// client is handed both before a flush and sends partition 0 two batches
// in two requests in flight at once.
func TestLaneOfNoBrokerOneBatchPerPartition(t *testing.T) {
	t.Parallel()
	const topic = "outbox.event.order"
	kc := kafkatest.Start(t, kfake.SeedTopics(1, topic))
	h := &inflight{}
	seen := &sync.Map{}
	ctx := t.Context()
	ls, err := NewLanes(ctx, LanesConfig{
		Opts: []kgo.Opt{kgo.SeedBrokers(kc.Addrs()...), kgo.ProducerBatchMaxBytes(16 << 10), kgo.WithHooks(h),
			kgo.RecordPartitioner(PlacedPartitioner{ByKey: kgo.StickyKeyPartitioner(nil), Counts: seen})},
		Seen: seen, Queue: NewQueue(math.MaxInt, math.MaxInt, 0), Log: slog.New(slog.NewTextHandler(t.Output(), nil)),
		RequestTimeout: 10 * time.Second, MaxRecords: 1000, MaxBytes: 1 << 30,
		RoundCap: func(string) int32 { return 16 << 10 },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ls.Close)
	var wg sync.WaitGroup
	var failed atomic.Int32
	send := func(n int, key []byte) {
		for range n {
			r := &kgo.Record{Topic: topic, Key: key, Value: []byte(strings.Repeat("x", 1024)), Partition: -1}
			wg.Add(1)
			ls.Send(ctx, Item{Ctx: ctx, R: r, Size: RecordSize(r), Done: func(_ *kgo.Record, err error) {
				defer wg.Done()
				if err != nil {
					failed.Add(1)
				}
			}})
		}
	}
	// A keyless record first, through the lane of no broker: its client
	// has then produced to partition 0 (it sends a new partition's first
	// batch alone), and the flusher still knows no count for the topic's
	// keys.
	ls.BeginRound()
	send(1, nil)
	ls.EndRound(ctx)
	wg.Wait()
	v, _ := seen.LoadOrStore(topic, new(atomic.Int32))
	v.(*atomic.Int32).Store(0)
	kc.Slow(100 * time.Millisecond)
	ls.BeginRound()
	send(10, []byte("o-1"))    // no count known: partition -1, the lane of no broker
	v.(*atomic.Int32).Store(1) // a lane's client learnt the topic's count
	send(10, []byte("o-1"))    // partition 0, into the same lane (the gate)
	ls.EndRound(ctx)
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d of 21 records failed", failed.Load())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	t.Logf("%d produce requests, at most %d in flight", h.reqs, h.most)
	if h.most > 1 {
		t.Fatalf("partition 0's records went in %d produce requests in flight at once: the lane of no broker counted its records of partition -1 and 0 apart", h.most)
	}
	// Records without a key beside keyed ones, in the lane of no broker:
	// the client puts them in partition 0's batch (the topic's only one),
	// so they count toward it too. Before, they were not counted: 10
	// keyless and 10 keyed records of 1 KiB went in one flush under a
	// 16 KiB cap, two batches of partition 0 in flight.
	h.most, h.reqs = 0, 0
	h.mu.Unlock()
	ls.BeginRound()
	send(10, nil)
	send(10, []byte("o-1"))
	ls.EndRound(ctx)
	wg.Wait()
	h.mu.Lock()
	if failed.Load() != 0 {
		t.Fatalf("%d of the second round's 20 records failed", failed.Load())
	}
	t.Logf("keyless beside keyed: %d produce requests, at most %d in flight", h.reqs, h.most)
	if h.most > 1 {
		t.Fatalf("partition 0's records went in %d produce requests in flight at once: records without a key were not counted in its batch", h.most)
	}
}
