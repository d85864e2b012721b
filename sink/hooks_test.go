package sink

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// TestKpromInOpts: a library user puts franz-go's kprom hook in Config.Opts,
// where client options go. The sink makes several clients (one per broker,
// the dialer's probe, the exactly-once offsets reader and fencer); kprom
// registers its metrics when it sees a client created, and registering
// twice panics. With three brokers, at least once and exactly once: no
// panic, the metrics registered once (still there after the sink's other
// clients closed), and each record counted once.
func TestKpromInOpts(t *testing.T) {
	t.Parallel()
	const topic = "outbox.event.order"
	for _, tc := range []struct {
		name string
		txn  bool
	}{
		{"at least once", false},
		{"exactly once", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kc := kafkatest.Start(t, kfake.NumBrokers(3), kfake.SeedTopics(6, topic))
			reg := prometheus.NewRegistry()
			m := kprom.NewMetrics("lib", kprom.Registerer(reg), kprom.Gatherer(reg), kprom.FetchAndProduceDetail(kprom.ByTopic, kprom.Records))
			opts := []kgo.Opt{kgo.WithHooks(m)}
			var s *Sink
			if tc.txn {
				s = txnSink(t, kc, "walrelay-kprom", opts...)
			} else {
				s = newSink(t, kc, Config{Opts: opts})
			}
			const n = 60
			var wg sync.WaitGroup
			var mu sync.Mutex
			var failed []error
			for i := range n {
				e := txnEvent(0x100, i)
				e.AggregateID = fmt.Sprint("k", i%24)
				wg.Add(1)
				s.Publish(t.Context(), e, func(_ Delivery, err error) {
					defer wg.Done()
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						failed = append(failed, err)
					}
				})
			}
			wg.Wait()
			if len(failed) > 0 {
				t.Fatalf("%d of %d events failed: %v", len(failed), n, failed[0])
			}
			// kprom counts a batch in a hook franz-go may call after the
			// records' promises: wait for the count, and fail on more.
			var records float64
			names := map[string]bool{}
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				mfs, err := reg.Gather()
				if err != nil {
					t.Fatal(err)
				}
				records = 0
				for _, mf := range mfs {
					names[mf.GetName()] = true
					if mf.GetName() != "lib_produce_records_total" {
						continue
					}
					for _, mt := range mf.GetMetric() {
						for _, l := range mt.GetLabel() {
							if l.GetName() == "topic" && l.GetValue() == topic {
								records += mt.GetCounter().GetValue()
							}
						}
					}
				}
				if records >= n || time.Now().After(deadline) {
					break
				}
			}
			if !names["lib_connects_total"] || !names["lib_write_bytes_total"] {
				t.Fatalf("kprom's metrics are not registered (anymore): %v", names)
			}
			if records != n {
				t.Fatalf("lib_produce_records_total{topic=%q} is %v, want %d: each record counted once", topic, records, n)
			}
		})
	}
}
