package sink

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// TestSlowBrokerCostsOnlyItsPartitions: one slow broker costs only its own partitions. In a
// cluster of three kfake brokers, events go at a steady rate to 48 keys over
// 6 partitions, first with no slow broker, then with one that answers every
// request 500 ms late; the median publish-to-ack latency of each partition
// in each phase is logged, with its ratio. The partitions of the healthy
// brokers must stay well below the slow broker's delay (a fifth of it): one
// publishing round over every broker made them wait about half of it. That
// bound is far from both (about 1 ms against 500 ms), so a noisy machine
// does not move a partition across it; the ratio (1.0x) is the figure.
func TestSlowBrokerCostsOnlyItsPartitions(t *testing.T) {
	t.Parallel()
	const topic = "outbox.event.order"
	kc := kafkatest.Start(t, kfake.NumBrokers(3), kfake.SeedTopics(6, topic))
	leaders := partitionLeaders(t, kc, topic)
	s := newSink(t, kc, Config{Linger: time.Millisecond})

	var mu sync.Mutex
	latencies := map[int32][]time.Duration{}
	var failed []error
	// phase publishes for d at one event a millisecond, waits for every ack
	// and returns the median latency per partition.
	phase := func(d time.Duration) map[int32]time.Duration {
		clear(latencies)
		var wg sync.WaitGroup
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for i, end := 0, time.Now().Add(d); time.Now().Before(end); i++ {
			<-tick.C
			e := newEvent(fmt.Sprint("e", i))
			e.AggregateID = fmt.Sprint("k", i%48)
			began := time.Now()
			wg.Add(1)
			s.Publish(t.Context(), e, func(d Delivery, err error) {
				defer wg.Done()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed = append(failed, err)
					return
				}
				latencies[d.Partition] = append(latencies[d.Partition], time.Since(began))
			})
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(failed) > 0 {
			t.Fatalf("%d events failed: %v", len(failed), failed[0])
		}
		medians := map[int32]time.Duration{}
		for p, ls := range latencies {
			slices.Sort(ls)
			medians[p] = ls[len(ls)/2]
		}
		return medians
	}
	phase(500 * time.Millisecond) // warm: metadata, producer id
	base := phase(2 * time.Second)
	slowNode := leaders[0]
	const delay = 500 * time.Millisecond
	kc.Node(slowNode).Slow(delay)
	slow := phase(2 * time.Second)
	kc.Up()
	for p := range int32(6) {
		healthy := leaders[p] != slowNode
		t.Logf("partition %d (leader %s, slow %v): median publish-to-ack %v with no slow broker, %v with one (%.1fx)",
			p, leaders[p], !healthy, base[p].Round(100*time.Microsecond), slow[p].Round(100*time.Microsecond), float64(slow[p])/float64(base[p]))
		if healthy && slow[p] > delay/5 {
			t.Errorf("partition %d, led by a healthy broker, waited %v with one slow broker (%v late)", p, slow[p], delay)
		}
	}
}

// partitionLeaders returns the address of each partition's leader.
func partitionLeaders(t *testing.T, kc *kafkatest.Cluster, topic string) map[int32]string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	md, err := kadm.NewClient(cl).Metadata(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	addrs := map[int32]string{}
	for _, b := range md.Brokers {
		addrs[b.NodeID] = fmt.Sprintf("%s:%d", b.Host, b.Port)
	}
	leaders := map[int32]string{}
	for _, p := range md.Topics[topic].Partitions {
		leaders[p.Partition] = addrs[p.Leader]
	}
	return leaders
}
