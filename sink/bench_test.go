package sink

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// BenchmarkPublishLanes measures the sink's hot path in at-least-once mode:
// keyed events (96 keys) published into three kfake brokers, through the
// flusher and the lanes, until each is acknowledged. b.N events per run, at
// most 4096 unanswered at a time.
func BenchmarkPublishLanes(b *testing.B) {
	const topic = "outbox.event.order"
	kc := kafkatest.Start(b, kfake.NumBrokers(3), kfake.SeedTopics(6, topic))
	s, err := New(Config{Brokers: kc.Addrs(), Linger: time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	events := make([]*event.Event, 96)
	for i := range events {
		events[i] = newEvent(fmt.Sprint("e", i))
		events[i].AggregateID = fmt.Sprint("k", i)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	sem := make(chan struct{}, 4096)
	done := func(_ Delivery, err error) {
		if err != nil {
			mu.Lock()
			failed = err
			mu.Unlock()
		}
		<-sem
		wg.Done()
	}
	// Warm: metadata, producer ids, every lane.
	for i := range 500 {
		sem <- struct{}{}
		wg.Add(1)
		s.Publish(b.Context(), events[i%len(events)], done)
	}
	wg.Wait()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N { // not b.Loop: the wait for the last acks counts
		sem <- struct{}{}
		wg.Add(1)
		s.Publish(b.Context(), events[i%len(events)], done)
	}
	wg.Wait()
	b.StopTimer()
	if failed != nil {
		b.Fatal(failed)
	}
}
