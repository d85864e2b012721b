package sink

import (
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// fakeTracer records what the sink tells a Tracer.
type fakeTracer struct {
	mu      sync.Mutex
	parents []string
	states  []string
	ends    []Delivery
	roots   bool // start a trace for an event without a context
}

const carried = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01"

func (f *fakeTracer) Publish(_ *event.Event, parent, state []byte) ([]byte, func(Delivery, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if parent == nil && !f.roots {
		return nil, nil
	}
	f.parents, f.states = append(f.parents, string(parent)), append(f.states, string(state))
	return []byte(carried), func(d Delivery, _ error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.ends = append(f.ends, d)
	}
}

func tracedEvent(id string) *event.Event {
	e := newEvent(id)
	e.Headers = append(e.Headers, event.Header{Key: HeaderTraceparent, Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
		event.Header{Key: HeaderTracestate, Value: []byte("k=v")})
	return e
}

// TestTracerCarriesPublishSpan: an event with a trace context is given to
// the Tracer, its record carries the traceparent the Tracer returned (the
// event itself is unchanged, for a publish again), and the Tracer hears
// its fate with the offset; a dead-lettered event too, with its reason.
func TestTracerCarriesPublishSpan(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	ft := &fakeTracer{}
	s := newSink(t, kc, Config{Topic: "orders", Tracer: ft})
	e := tracedEvent("e1")
	for range 2 {
		if err := publish(t, s, e); err != nil {
			t.Fatal(err)
		}
	}
	bad := tracedEvent("e2")
	bad.AggregateType = "has space"
	s2 := newSink(t, kc, Config{Tracer: ft})
	if err := publish(t, s2, bad); err != nil {
		t.Fatal(err)
	}
	if got := string(e.Headers[1].Value); got != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Errorf("the event's traceparent became %s", got)
	}
	col, err := kafkatest.Collect(kc.Addrs(), `orders`)
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) == 2 })
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if got := string(kafkatest.Header(r, HeaderTraceparent)); got != carried {
			t.Errorf("record's traceparent %s, want the tracer's %s", got, carried)
		}
		if got := string(kafkatest.Header(r, HeaderTracestate)); got != "k=v" {
			t.Errorf("record's tracestate %q", got)
		}
	}
	ft.mu.Lock()
	defer ft.mu.Unlock()
	if len(ft.parents) != 3 || ft.parents[1] != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || ft.states[0] != "k=v" {
		t.Errorf("tracer given %q %q", ft.parents, ft.states)
	}
	if len(ft.ends) != 3 || ft.ends[0].Topic != "orders" || ft.ends[0].Offset != 0 || ft.ends[1].Offset != 1 || ft.ends[2].DeadLetter != "invalid_topic" {
		t.Errorf("tracer's ends %+v", ft.ends)
	}
}

// TestTracerRootSpan: an event without a trace context, given to a Tracer
// that starts a new trace (tracing.root_spans), gets the traceparent
// header the Tracer returned, and the Tracer hears its fate.
func TestTracerRootSpan(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	ft := &fakeTracer{roots: true}
	s := newSink(t, kc, Config{Topic: "roots", Tracer: ft})
	e := newEvent("e1")
	if err := publish(t, s, e); err != nil {
		t.Fatal(err)
	}
	if len(e.Headers) != 0 && e.Headers[len(e.Headers)-1].Key == HeaderTraceparent {
		t.Errorf("the event itself was given a traceparent: %v", e.Headers)
	}
	col, err := kafkatest.Collect(kc.Addrs(), `roots`)
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) == 1 })
	if err != nil {
		t.Fatal(err)
	}
	if got := string(kafkatest.Header(recs[0], HeaderTraceparent)); got != carried {
		t.Errorf("record's traceparent %q, want the new trace's %s", got, carried)
	}
	ft.mu.Lock()
	defer ft.mu.Unlock()
	if len(ft.parents) != 1 || ft.parents[0] != "" || len(ft.ends) != 1 || ft.ends[0].Topic != "roots" {
		t.Errorf("tracer given %q, ends %+v", ft.parents, ft.ends)
	}
}

// TestUntracedEventsAllocateNothing: an event without a trace context costs
// the Tracer hook no allocation (and without a Tracer, Publish does not
// call it: one nil check).
func TestUntracedEventsAllocateNothing(t *testing.T) {
	s := &Sink{cfg: Config{Tracer: &fakeTracer{}}}
	e := newEvent("e1")
	done := Done(func(Delivery, error) {})
	if n := testing.AllocsPerRun(1000, func() { e, done = s.traced(e, done) }); n != 0 {
		t.Errorf("%v allocations per untraced event", n)
	}
}
