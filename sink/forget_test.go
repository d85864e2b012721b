package sink

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// TestForgottenTopicsPurgedFromClients: the sink's own topic cache is
// capped at maxCachedTopics, and a topic it forgets is purged from the
// Kafka clients too (in batches of purgeBatch): rows with ever new
// aggregate types, all under an allowed prefix, do not make the clients'
// metadata requests name every topic a row ever chose. (A topic forgotten
// by the sink alone once stayed in the clients for the life of the
// process.)
func TestForgottenTopicsPurgedFromClients(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t, kfake.DefaultNumPartitions(1))
	var most atomic.Int64
	kc.ControlKey(int16(kmsg.Metadata), func(r kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		if n := int64(len(r.(*kmsg.MetadataRequest).Topics)); n > most.Load() {
			most.Store(n)
		}
		return nil, nil, false
	})
	s := newSink(t, kc, Config{Topic: "outbox.event.{aggregatetype}", AllowedTopics: []string{"outbox.event.*"}})
	const n = maxCachedTopics + 500
	var wg sync.WaitGroup
	var failed atomic.Int64
	start := time.Now()
	for i := range n {
		e := newEvent(fmt.Sprintf("e%d", i))
		e.AggregateType = fmt.Sprintf("t%d", i)
		wg.Add(1)
		s.Publish(t.Context(), e, func(_ Delivery, err error) {
			if err != nil {
				failed.Add(1)
			}
			wg.Done()
		})
	}
	wg.Wait()
	t.Logf("%d events to %d topics in %s, %d failed; the largest metadata request named %d topics", n, n, time.Since(start), failed.Load(), most.Load())
	if most.Load() > maxCachedTopics+purgeBatch {
		t.Fatalf("the client's metadata requests name %d topics, past the sink's cap of %d and a purge batch of %d: the client remembers every topic a row chose", most.Load(), maxCachedTopics, purgeBatch)
	}
}
