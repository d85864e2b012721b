package tracing_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/sink"
	"github.com/walrelay/walrelay/tracing"
)

// discard is an exporter that drops every span: the benchmark measures
// walrelay's side, not a collector's.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkPublishTracing is sink's BenchmarkPublishLanes (keyed events
// into three kfake brokers until acknowledged) with every event carrying a
// sampled writer's traceparent: tracing off, on with 1% of traces sampled
// (traceidratio, whatever the writer decided), and on with every event
// traced (the default parentbased_always_on), spans exported to nowhere.
// ns/op and allocs/op are per event.
func BenchmarkPublishTracing(b *testing.B) {
	for _, tc := range []struct {
		name, sampler, arg string
		on                 bool
	}{{"off", "", "", false}, {"1pct", "traceidratio", "0.01", true}, {"all", "", "", true}} {
		b.Run(tc.name, func(b *testing.B) {
			b.Setenv("OTEL_TRACES_SAMPLER", tc.sampler)
			b.Setenv("OTEL_TRACES_SAMPLER_ARG", tc.arg)
			cfg := sink.Config{Linger: time.Millisecond}
			if tc.on {
				tr, err := tracing.New(b.Context(), tracing.Config{Enabled: true, Exporter: discard{}})
				if err != nil {
					b.Fatal(err)
				}
				defer func() { _ = tr.Shutdown(context.Background()) }()
				cfg.Tracer = tr
			}
			benchPublish(b, cfg)
		})
	}
}

func benchPublish(b *testing.B, cfg sink.Config) {
	const topic = "outbox.event.order"
	kc := kafkatest.Start(b, kfake.NumBrokers(3), kfake.SeedTopics(6, topic))
	cfg.Brokers = kc.Addrs()
	s, err := sink.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	events := make([]*event.Event, 96)
	for i := range events {
		events[i] = &event.Event{ID: fmt.Sprint("e", i), AggregateType: "order", AggregateID: fmt.Sprint("k", i), Type: "Created",
			Payload: []byte(`{"a":1}`), Source: "public.outbox", Xid: 12, CommitLSN: 0x1234, CommitTime: time.Now(), Transactional: true,
			Headers: []event.Header{{Key: sink.HeaderTraceparent, Value: fmt.Appendf(nil, "00-4bf92f3577b34da6a3ce929d0e0e%04x-00f067aa0ba902b7-01", i)}}}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	sem := make(chan struct{}, 4096)
	done := func(_ sink.Delivery, err error) {
		if err != nil {
			mu.Lock()
			failed = err
			mu.Unlock()
		}
		<-sem
		wg.Done()
	}
	for i := range 500 {
		sem <- struct{}{}
		wg.Add(1)
		s.Publish(b.Context(), events[i%len(events)], done)
	}
	wg.Wait()
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for i := range b.N {
		sem <- struct{}{}
		wg.Add(1)
		s.Publish(b.Context(), events[i%len(events)], done)
	}
	wg.Wait()
	b.StopTimer()
	// The process's CPU time (user and system, every goroutine: the sink,
	// the client, the span processor, and kfake's brokers) per event.
	b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/event")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	if failed != nil {
		b.Fatal(failed)
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
