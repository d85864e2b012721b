package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// bufferedHook calls f with each record a client is handed (Produce).
type bufferedHook func(*kgo.Record)

func (h bufferedHook) OnProduceRecordBuffered(r *kgo.Record) { h(r) }

// eventIndex returns n of a record of event "e<n>" (its id header).
func eventIndex(r *kgo.Record) int {
	for _, h := range r.Headers {
		if h.Key == "id" {
			n, _ := strconv.Atoi(strings.TrimPrefix(string(h.Value), "e"))
			return n
		}
	}
	return -1
}

// TestAbortMidRoundSendsNothingAfter: an Abort while a lane hands its round
// to its client fails the rest of the round, unsent. 200 events of one key
// go in one round; when the lane's client is handed e45, the test aborts the
// sink and lets the lane go on once the sink is broken. Before the fix the
// lane handed the client e46..e199 after the abort had failed e0..e44, and
// those were acknowledged after them, out of order; the hook of e46 (which
// only that code reaches) waits for the first failure to show it. Every
// event must fail, or the acknowledged ones come before every failed one.
func TestAbortMidRoundSendsNothingAfter(t *testing.T) {
	t.Parallel()
	const topic, n, at = "outbox.event.order", 200, 45
	kc := kafkatest.Start(t, kfake.SeedTopics(1, topic))
	var s *Sink
	var (
		aborted     = make(chan error, 1)
		firstFailed = make(chan struct{})
		failOnce    sync.Once
	)
	var once atomic.Bool
	hook := bufferedHook(func(r *kgo.Record) {
		switch i := eventIndex(r); {
		case i == at && once.CompareAndSwap(false, true):
			go func() { aborted <- s.Abort(t.Context()) }()
			for deadline := time.Now().Add(10 * time.Second); s.q.BrokenNow() == nil; {
				if time.Now().After(deadline) {
					t.Error("the sink is not broken 10s after Abort")
					return
				}
				time.Sleep(time.Millisecond)
			}
		case i == at+1:
			// Only a lane that goes on producing after the abort gets
			// here: let the abort fail what it holds first.
			select {
			case <-firstFailed:
				time.Sleep(100 * time.Millisecond) // AbortBufferedRecords returns
			case <-time.After(10 * time.Second):
			}
		}
	})
	// One round of all 200: the queue's round is full at a quarter of
	// MaxBufferedRecords, and the linger is longer than the test.
	s = newSink(t, kc, Config{Linger: time.Minute, MaxBufferedRecords: 4 * n, ProducerOpts: []kgo.Opt{kgo.WithHooks(hook)}})
	var mu sync.Mutex
	results := make([]error, n)
	order := make([]int, 0, n) // the events in the order they were answered
	var wg sync.WaitGroup
	for i := range n {
		e := newEvent(fmt.Sprint("e", i))
		wg.Add(1)
		s.Publish(t.Context(), e, func(_ Delivery, err error) {
			defer wg.Done()
			if err != nil {
				failOnce.Do(func() { close(firstFailed) })
			}
			mu.Lock()
			defer mu.Unlock()
			results[i] = err
			order = append(order, i)
		})
	}
	wg.Wait()
	if err := <-aborted; err != nil {
		t.Fatalf("abort: %v", err)
	}
	firstFail, lastAck := -1, -1
	for i, err := range results {
		if err != nil && firstFail < 0 {
			firstFail = i
		}
		if err == nil {
			lastAck = i
		}
	}
	if firstFail >= 0 && lastAck > firstFail {
		var acked []int
		for _, i := range order {
			if results[i] == nil && i > firstFail {
				acked = append(acked, i)
			}
		}
		t.Fatalf("one key, one partition: e%d failed (%v), and %d later events were acknowledged after it, e%d..e%d",
			firstFail, results[firstFail], len(acked), acked[0], acked[len(acked)-1])
	}
	t.Logf("first failure e%d, last acknowledged e%d", firstFail, lastAck)
}

// lead makes partitions from..to-1 of topic led by nodes, in turn.
func lead(t *testing.T, kc *kafkatest.Cluster, topic string, from, to int32, nodes ...int32) {
	t.Helper()
	for p := from; p < to; p++ {
		if err := kc.MoveTopicPartition(topic, p, nodes[int(p)%len(nodes)]); err != nil {
			t.Fatal(err)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestAddedPartitionsMoveEachKeyOnce: a topic that gains partitions
// (6 -> 12, on three kfake brokers) while walrelay streams moves each key
// at most once, from its old partition to its new one, with no publish
// failing. One lane's client learns the new count first (its metadata
// refreshed by hand), the others only when they are handed a record of a
// partition they do not know. Before the fix every lane client wrote its
// own count into one value that the flusher partitioned by: records for
// partitions 6..11 went to clients that knew 6 and failed ("invalid record
// partitioning choice of 9 from 6 available"), and keys went back and
// forth. The change is logged once, at one position of the stream.
func TestAddedPartitionsMoveEachKeyOnce(t *testing.T) {
	t.Parallel()
	const topic, keys = "outbox.event.order", 48
	kc := kafkatest.Start(t, kfake.NumBrokers(3), kfake.SeedTopics(6, topic))
	lead(t, kc, topic, 0, 6, 0, 1, 2) // a lane for each broker
	var logs syncBuffer
	s := newSink(t, kc, Config{Linger: time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	var mu sync.Mutex
	var failed []error
	next := 0
	// publish publishes rounds of one event per key, and waits for each.
	publish := func(rounds int) {
		for range rounds {
			var wg sync.WaitGroup
			for k := range keys {
				e := newEvent(fmt.Sprint("e", next))
				e.AggregateID = fmt.Sprint("k", k)
				e.CommitLSN, e.Index = pglogrepl.LSN(0x1000+next/keys), next%keys
				next++
				wg.Add(1)
				s.Publish(t.Context(), e, func(_ Delivery, err error) {
					defer wg.Done()
					if err != nil {
						mu.Lock()
						failed = append(failed, err)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			mu.Lock()
			broke := len(failed) > 0
			mu.Unlock()
			if broke { // as the relay does: abort, and go on
				if err := s.Abort(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	publish(10) // every broker's lane made, the topic's count known
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreatePartitions(t.Context(), 6, topic); err != nil {
		t.Fatal(err)
	}
	// Broker 0's lane's client learns of the new partitions, which
	// brokers 1 and 2 lead, and the others' not yet.
	lead(t, kc, topic, 6, 12, 1, 2)
	fresh := s.lanes.Clients()[0]
	fresh.ForceMetadataRefresh()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if ld, _, _ := fresh.PartitionLeader(topic, 11); ld >= 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the refreshed client does not know partition 11 after 10s")
		}
	}
	publish(20)
	// The stale lanes' clients learnt the new partitions when they were
	// handed records of them (await), not 5 minutes later.
	var knew []int32
	for id, cl := range s.lanes.Clients() {
		if ld, _, _ := cl.PartitionLeader(topic, 11); id >= 0 && ld >= 0 {
			knew = append(knew, id)
		}
	}
	if len(knew) < 2 {
		t.Errorf("only the lanes of brokers %v know partition 11: the stale ones were handed none of the new partitions' records", knew)
	}
	mu.Lock()
	if len(failed) > 0 {
		t.Errorf("%d of %d events failed, the first: %v", len(failed), next, failed[0])
	}
	mu.Unlock()

	col, err := kafkatest.Collect(kc.Addrs(), `outbox\.event\.order`)
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	want := next - len(failed)
	recs, err := col.Wait(ctx, func(r []*kgo.Record) bool { return len(r) >= want })
	if err != nil {
		t.Fatalf("read %d of %d records: %v", len(recs), want, err)
	}
	// Per key, its events in order: their partitions must be one, or two
	// with every event in the first before every one in the second.
	type placed struct {
		i         int
		partition int32
	}
	byKey := map[string][]placed{}
	for _, r := range recs {
		byKey[string(r.Key)] = append(byKey[string(r.Key)], placed{eventIndex(r), r.Partition})
	}
	moved := 0
	for k, ps := range byKey {
		slices.SortFunc(ps, func(a, b placed) int { return a.i - b.i })
		var seq []int32 // the partitions, each once, in the order the key went to them
		for _, p := range ps {
			if len(seq) == 0 || seq[len(seq)-1] != p.partition {
				seq = append(seq, p.partition)
			}
		}
		switch {
		case len(seq) > 2:
			t.Errorf("key %s went to partitions %v, in that order", k, seq)
		case len(seq) == 2:
			moved++
		}
	}
	t.Logf("%d records, %d of %d keys moved once", len(recs), moved, len(byKey))
	if n := strings.Count(logs.String(), "gained partitions"); n != 1 {
		t.Errorf("the change was logged %d times, want once:\n%s", n, logs.String())
	} else {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "gained partitions") {
				t.Log(line)
				if !strings.Contains(line, "from=6 to=12") {
					t.Errorf("the log line does not say 6 -> 12: %s", line)
				}
			}
		}
	}
}

// TestLaneOfDepartedBrokerClosed: once a broker leaves the cluster, its
// lane, idle, is closed with its client, and the sink goes on with the
// others. Before, lanes were made per broker id and never removed, so
// broker churn piled up clients until Close.
func TestLaneOfDepartedBrokerClosed(t *testing.T) {
	t.Parallel()
	const topic = "outbox.event.order"
	kc := kafkatest.Start(t, kfake.NumBrokers(3), kfake.SeedTopics(6, topic))
	lead(t, kc, topic, 0, 6, 0, 1, 2)
	s := newSink(t, kc, Config{Linger: time.Millisecond})
	publishAll := func(from, n int) {
		t.Helper()
		for i := from; i < from+n; i++ {
			e := newEvent(fmt.Sprint("e", i))
			e.AggregateID = fmt.Sprint("k", i%24)
			if err := publish(t, s, e); err != nil {
				t.Fatal(err)
			}
		}
	}
	publishAll(0, 48) // a lane for each broker
	lanes := s.lanes.Clients()
	gone, goneCl := int32(-1), (*kgo.Client)(nil)
	for id, cl := range lanes {
		if id >= 0 && (goneCl == nil || id > gone) {
			gone, goneCl = id, cl
		}
	}
	n := len(lanes)
	if n != 4 {
		t.Fatalf("%d lanes, want one per broker and the lane of no broker", n)
	}
	if err := kc.RemoveNode(gone); err != nil {
		t.Fatal(err)
	}
	if err := s.sweepLanes(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, still := s.lanes.Clients()[gone]
	if still {
		t.Fatalf("the lane of broker %d, which left the cluster, is still open", gone)
	}
	// Its client is closed once the lane has stopped.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		req := kmsg.NewPtrMetadataRequest()
		if _, err := req.RequestWith(t.Context(), goneCl); errors.Is(err, kgo.ErrClientClosed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the departed broker's client is not closed after 10s")
		}
	}
	publishAll(48, 48) // the others' lanes go on, the partitions' new leaders too
}

// publishSlowed publishes n events of one key with 1 KiB payloads, every
// broker answer 50 ms late, waits for every answer (failing t on an event
// that failed), and returns h's count of produce requests and the most in
// flight at once to one broker.
func publishSlowed(t *testing.T, s *Sink, kc *kafkatest.Cluster, h *inflightHook, n int) (requests, most int) {
	t.Helper()
	return publishSlowedOf(t, s, kc, h, n, 1024, 1)
}

// publishSlowedOf is publishSlowed with payloads of size bytes, the events
// spread over keys keys in turn.
func publishSlowedOf(t *testing.T, s *Sink, kc *kafkatest.Cluster, h *inflightHook, n, size, keys int) (requests, most int) {
	t.Helper()
	kc.Slow(50 * time.Millisecond)
	payload := []byte(`{"a":"` + strings.Repeat("x", size) + `"}`)
	var wg sync.WaitGroup
	var failed atomic.Int32
	for i := range n {
		e := newEvent(fmt.Sprint("e", i))
		e.Payload = payload
		if keys > 1 {
			e.AggregateID = fmt.Sprint("o-", i%keys)
		}
		e.CommitLSN += pglogrepl.LSN(i + 1)
		wg.Add(1)
		s.Publish(t.Context(), e, func(_ Delivery, err error) {
			defer wg.Done()
			if err != nil {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	kc.Up()
	if failed.Load() != 0 {
		t.Fatalf("%d of %d events failed", failed.Load(), n)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	t.Logf("%d produce requests, at most %d in flight to one broker", h.requests, h.most)
	return h.requests, h.most
}

// inflightHook counts the produce requests a client has written and not
// yet read the answer of, per broker, and keeps the highest count and the
// largest request written.
type inflightHook struct {
	mu       sync.Mutex
	inflight map[int32]int
	most     int
	requests int
	largest  int // bytes
}

func (h *inflightHook) OnBrokerWrite(m kgo.BrokerMetadata, key int16, written int, _, _ time.Duration, err error) {
	if key != int16(kmsg.Produce) || err != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inflight == nil {
		h.inflight = map[int32]int{}
	}
	h.inflight[m.NodeID]++
	h.requests++
	h.most = max(h.most, h.inflight[m.NodeID])
	h.largest = max(h.largest, written)
}

func (h *inflightHook) OnBrokerRead(m kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, _ error) {
	if key != int16(kmsg.Produce) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inflight[m.NodeID] > 0 {
		h.inflight[m.NodeID]--
	}
}

// TestLaneRoundOneBatchPerPartition: a lane hands its client at most one
// batch's worth of a partition's records between two flushes, so that a
// partition's records are never split over produce requests in flight
// together (the idempotent client pipelines up to five per broker, the
// pattern of KAFKA-15591, and kgo.MaxProduceRequestsInflightPerBroker does
// not apply to an idempotent client). One key, one partition, batches
// capped at 16 KiB, every answer of the broker 50 ms late so that the next
// round gathers 400 events of 1 KiB (about 400 KiB) while the first is in
// flight. Before the fix that round went to the client whole and was sent
// as some 25 batches in up to five requests in flight at once; now one
// produce request at a time, each with one batch of the partition. The
// same in exactly-once mode, where the transactional client is handed one
// batch's worth of a topic's keyed records between two flushes.
func TestLaneRoundOneBatchPerPartition(t *testing.T) {
	t.Parallel()
	for _, exactlyOnce := range []bool{false, true} {
		t.Run(fmt.Sprint("exactly_once=", exactlyOnce), func(t *testing.T) {
			t.Parallel()
			const topic, n = "outbox.event.order", 400
			kc := kafkatest.Start(t, kfake.SeedTopics(1, topic))
			h := &inflightHook{}
			cfg := Config{BatchMaxBytes: 16 << 10, MaxBufferedBytes: 8 << 20, MaxBufferedRecords: 100000, ProducerOpts: []kgo.Opt{kgo.WithHooks(h)}}
			if exactlyOnce {
				cfg.Transactions = &Transactions{ID: "walrelay-one-batch", Key: "slot_a", Source: "db"}
			}
			s := newSink(t, kc, cfg)
			if exactlyOnce {
				startTxn(t, s)
			}
			if err := publish(t, s, newEvent("warm")); err != nil {
				t.Fatal(err)
			}
			requests, most := publishSlowed(t, s, kc, h, n)
			if most > 1 {
				t.Fatalf("one partition's records went in %d produce requests in flight at once: a round was split over pipelined requests", most)
			}
			if requests < n*1024/(16<<10) {
				t.Fatalf("%d produce requests for %d KiB in batches of 16 KiB: the test did not exercise the cap", requests, n)
			}
		})
	}
}
