package sink

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

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
			for deadline := time.Now().Add(10 * time.Second); s.q.brokenNow() == nil; {
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
