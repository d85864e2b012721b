package tracing

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/sink"
)

const (
	writerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	writerSpan  = "00f067aa0ba902b7"
)

func newTest(t *testing.T, exp sdktrace.SpanExporter, size int) (*Tracing, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	tr, err := New(t.Context(), Config{Enabled: true, Exporter: exp, QueueSize: size, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	return tr, &logs
}

func newRoots(t *testing.T, exp sdktrace.SpanExporter, roots bool) *Tracing {
	t.Helper()
	tr, err := New(t.Context(), Config{Enabled: true, Exporter: exp, RootSpans: roots})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	return tr
}

// TestRootSpans: an event without a trace context starts no trace (and
// costs no allocation) by default; with RootSpans it starts one whose root
// is the send span, the WAL wait its child, the record carrying the root,
// unless the sampler (OTEL_TRACES_SAMPLER) says no.
func TestRootSpans(t *testing.T) {
	tests := []struct {
		name    string
		roots   bool
		sampler string
		want    int // spans
	}{
		{name: "off by default", want: 0},
		{name: "root spans", roots: true, want: 2},
		{name: "root spans, always_off sampler", roots: true, sampler: "always_off", want: 0},
		{name: "root spans, traceidratio 0", roots: true, sampler: "traceidratio", want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.sampler != "" {
				t.Setenv("OTEL_TRACES_SAMPLER", tt.sampler)
				t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
			}
			exp := tracetest.NewInMemoryExporter()
			tr := newRoots(t, exp, tt.roots)
			e := testEvent()
			if !tt.roots {
				if n := testing.AllocsPerRun(1000, func() { tr.Publish(e, nil, nil) }); n != 0 {
					t.Errorf("%v allocations per event without a context", n)
				}
			}
			carry, end := tr.Publish(e, nil, nil)
			if (end != nil) != (tt.want > 0) {
				t.Fatalf("end %v, want a span: %v", end != nil, tt.want > 0)
			}
			if end != nil {
				end(sink.Delivery{Topic: "orders", Partition: 0, Offset: 7}, nil)
			}
			if err := tr.ForceFlush(t.Context()); err != nil {
				t.Fatal(err)
			}
			spans := exp.GetSpans()
			if len(spans) != tt.want {
				t.Fatalf("%d spans, want %d", len(spans), tt.want)
			}
			if tt.want == 0 {
				return
			}
			wait, send := spans[0], spans[1]
			if send.Parent.IsValid() || send.Name != "send orders" {
				t.Errorf("send span %q parent %v, want a root", send.Name, send.Parent)
			}
			if wait.Name != SpanWALWait || wait.Parent.SpanID() != send.SpanContext.SpanID() || wait.SpanContext.TraceID() != send.SpanContext.TraceID() {
				t.Errorf("wal wait span %q parent %v, want the send span %v", wait.Name, wait.Parent, send.SpanContext)
			}
			if want := "00-" + send.SpanContext.TraceID().String() + "-" + send.SpanContext.SpanID().String() + "-01"; string(carry) != want {
				t.Errorf("carried traceparent %s, want the root's %s", carry, want)
			}
		})
	}
}

func testEvent() *event.Event {
	return &event.Event{ID: "e1", AggregateID: "order-1", Source: "public.outbox", WALStart: 0x16B3748, CommitLSN: 0x16B3800, Xid: 771,
		CommitTime: time.Now().Add(-50 * time.Millisecond), Transactional: true}
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, a := range s.Attributes {
		m[a.Key] = a.Value
	}
	return m
}

// TestPublishSpans: an event with a sampled writer's context gets a WAL
// wait span from its commit time and a producer span ended by its fate,
// both children of the writer's span; the record carries the producer
// span's context.
func TestPublishSpans(t *testing.T) {
	tests := []struct {
		name   string
		d      sink.Delivery
		err    error
		status codes.Code
		want   map[attribute.Key]string
	}{
		{name: "acked", d: sink.Delivery{Topic: "orders", Partition: 2, Offset: 41}, status: codes.Unset,
			want: map[attribute.Key]string{"messaging.destination.name": "orders", "messaging.destination.partition.id": "2", "messaging.kafka.offset": "41"}},
		{name: "dead-lettered", d: sink.Delivery{Topic: "dlq", Partition: 0, Offset: 3, DeadLetter: "invalid_topic"}, status: codes.Error,
			want: map[attribute.Key]string{"messaging.destination.name": "dlq", AttrDeadLetter: "invalid_topic", "messaging.kafka.offset": "3"}},
		{name: "failed", d: sink.Delivery{Topic: "orders", Partition: -1}, err: errors.New("broker down"), status: codes.Error,
			want: map[attribute.Key]string{"messaging.destination.name": "orders", "error.type": "_OTHER"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exp := tracetest.NewInMemoryExporter()
			tr, _ := newTest(t, exp, 0)
			e := testEvent()
			carry, end := tr.Publish(e, []byte("00-"+writerTrace+"-"+writerSpan+"-01"), []byte("k=v"))
			if end == nil {
				t.Fatal("no span for a valid traceparent")
			}
			end(tt.d, tt.err)
			if err := tr.ForceFlush(t.Context()); err != nil {
				t.Fatal(err)
			}
			spans := exp.GetSpans()
			if len(spans) != 2 {
				t.Fatalf("%d spans, want 2 (wal wait, send)", len(spans))
			}
			wait, send := spans[0], spans[1]
			for _, s := range spans {
				if s.Parent.TraceID().String() != writerTrace || s.Parent.SpanID().String() != writerSpan {
					t.Errorf("span %q: parent %v, want the writer's span", s.Name, s.Parent)
				}
				if a := attrs(s); a[AttrLSN].AsString() != "0/16B3748" || a[AttrCommitLSN].AsString() != "0/16B3800" {
					t.Errorf("span %q: LSN attributes %v", s.Name, s.Attributes)
				}
			}
			if wait.Name != SpanWALWait || !wait.StartTime.Equal(e.CommitTime) || !wait.EndTime.Equal(send.StartTime) {
				t.Errorf("wal wait span %q from %v to %v; want from the commit %v to the publish %v", wait.Name, wait.StartTime, wait.EndTime, e.CommitTime, send.StartTime)
			}
			if send.Name != "send "+tt.d.Topic || send.SpanKind != trace.SpanKindProducer || send.Status.Code != tt.status {
				t.Errorf("send span %q kind %v status %v, want %q producer %v", send.Name, send.SpanKind, send.Status, "send "+tt.d.Topic, tt.status)
			}
			a := attrs(send)
			if a["messaging.system"].AsString() != "kafka" || a["messaging.message.id"].AsString() != "e1" || a["messaging.operation.type"].AsString() != "send" {
				t.Errorf("send span attributes %v", send.Attributes)
			}
			for k, v := range tt.want {
				if got := a[k].String(); got != v {
					t.Errorf("send span %s = %q, want %q", k, got, v)
				}
			}
			if want := "00-" + writerTrace + "-" + send.SpanContext.SpanID().String() + "-01"; string(carry) != want {
				t.Errorf("carried traceparent %s, want the send span's %s", carry, want)
			}
			if got := send.SpanContext.TraceState().String(); got != "k=v" {
				t.Errorf("tracestate %q, want the writer's k=v", got)
			}
		})
	}
}

// TestWriterNotSampled: the writer's decision holds (parent-based by
// default): no span, and the record keeps the writer's traceparent, which
// carries the decision on.
func TestWriterNotSampled(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	exp := tracetest.NewInMemoryExporter()
	tr, _ := newTest(t, exp, 0)
	if carry, end := tr.Publish(testEvent(), []byte("00-"+writerTrace+"-"+writerSpan+"-00"), nil); end != nil || carry != nil {
		t.Errorf("a span for an unsampled writer's trace (carrying %s)", carry)
	}
	if err := tr.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(exp.GetSpans()); n != 0 {
		t.Errorf("%d spans exported for an unsampled writer's trace", n)
	}
}

// TestInvalidTraceparent: a value that does not parse starts no span.
func TestInvalidTraceparent(t *testing.T) {
	tr, _ := newTest(t, tracetest.NewInMemoryExporter(), 0)
	if _, end := tr.Publish(testEvent(), []byte("00-"+strings.Repeat("0", 32)+"-"+writerSpan+"-01"), nil); end != nil {
		t.Error("a span for an all-zero trace id")
	}
}

// stuck is an exporter that blocks until released: a collector that does
// not answer.
type stuck struct {
	release chan struct{}
	once    sync.Once
}

func (s *stuck) ExportSpans(ctx context.Context, _ []sdktrace.ReadOnlySpan) error {
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return errors.New("export timed out")
}

func (s *stuck) Shutdown(context.Context) error {
	s.once.Do(func() { close(s.release) })
	return nil
}

// TestStuckExporterNeverBlocks: with an exporter that never answers, ending
// spans does not wait: the spans beyond the queue are dropped, counted and
// logged once.
func TestStuckExporterNeverBlocks(t *testing.T) {
	exp := &stuck{release: make(chan struct{})}
	tr, logs := newTest(t, exp, 4)
	const n = 20000
	// The exporter never answers until the end of the test: a publish that
	// waited for it would never return. A hang, not a speed, is judged
	// (the bound is for a loaded machine under the race detector).
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range n {
			_, end := tr.Publish(testEvent(), []byte("00-"+writerTrace+"-"+writerSpan+"-01"), nil)
			end(sink.Delivery{Topic: "orders", Partition: 0}, nil)
		}
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%d publishes with the exporter stuck did not return in 2 minutes: a publish waits for the exporter", n)
	}
	if d := tr.Dropped(); d == 0 || d > 2*n {
		t.Errorf("dropped %d of %d spans", d, 2*n)
	}
	if c := strings.Count(logs.String(), "trace spans dropped"); c != 1 {
		t.Errorf("%d log lines about drops, want 1:\n%s", c, logs)
	}
	exp.Shutdown(t.Context())
}

// TestOff: disabled, New returns nil, which does nothing.
func TestOff(t *testing.T) {
	tr, err := New(t.Context(), Config{})
	if tr != nil || err != nil {
		t.Fatalf("New disabled = %v, %v", tr, err)
	}
	if tr.Dropped() != 0 || tr.Shutdown(t.Context()) != nil {
		t.Error("a nil Tracing does something")
	}
}

// TestProtocol: OTEL_EXPORTER_OTLP_PROTOCOL chooses the OTLP exporter;
// another value is an error that names it, never the headers' values.
func TestProtocol(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cret")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	tests := []struct {
		proto, traces string
		wantErr       bool
	}{
		{"", "", false}, {"grpc", "", false}, {"http/protobuf", "", false},
		{"grpc", "http/json", true}, {"thrift", "", true},
	}
	for _, tt := range tests {
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tt.proto)
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", tt.traces)
		tr, err := New(t.Context(), Config{Enabled: true})
		if (err != nil) != tt.wantErr {
			t.Errorf("protocol %q/%q: err %v, want error %v", tt.proto, tt.traces, err, tt.wantErr)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("the error shows a header's value: %v", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_ = tr.Shutdown(ctx)
		cancel()
	}
}

// TestUnansweredPublishExportsNoSendSpan: a publish Kafka never answered
// (walrelay killed before the acknowledgement) never ends its send span,
// so none is exported that would claim an acknowledgement: only the WAL
// wait, which did happen.
func TestUnansweredPublishExportsNoSendSpan(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, _ := newTest(t, exp, 0)
	if _, end := tr.Publish(testEvent(), []byte("00-"+writerTrace+"-"+writerSpan+"-01"), nil); end == nil {
		t.Fatal("no span")
	}
	if err := tr.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 || spans[0].Name != SpanWALWait {
		t.Errorf("spans exported before any answer: %v", spans)
	}
}
