package outbox_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/outbox"
)

// TestTraceColumnRecordsTheCallersSpan: with a trace column in the layout,
// each row holds the caller's current span context (a W3C traceparent, or
// the Properties text with tracestate when there is one, which walrelay's
// decoder reads); without a span, NULL.
func TestTraceColumnRecordsTheCallersSpan(t *testing.T) {
	t.Parallel()
	l := decoder.Layout{TraceColumn: "trace"}
	conn := setup(t, l)
	w, err := outbox.New(outbox.Config{Layout: l})
	if err != nil {
		t.Fatal(err)
	}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	state, _ := trace.ParseTraceState("vendor=x")
	sampled := trace.ContextWithSpanContext(t.Context(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	withState := trace.ContextWithSpanContext(t.Context(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceState: state}))
	tests := []struct {
		name string
		ctx  context.Context
		want *string
	}{
		{"sampled span", sampled, ptr("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
		{"with tracestate", withState, ptr("traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00\ntracestate=vendor=x")},
		{"no span", context.Background(), nil},
	}
	for _, tt := range tests {
		tx, err := conn.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		id, err := w.Write(tt.ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "o-1", Type: "Created", Payload: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		var got *string
		if err := tx.QueryRow(t.Context(), "SELECT trace FROM public.outbox WHERE id = $1", id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(t.Context()); err != nil {
			t.Fatal(err)
		}
		if (got == nil) != (tt.want == nil) || got != nil && *got != *tt.want {
			t.Errorf("%s: trace column %v, want %v", tt.name, deref(got), deref(tt.want))
		}
	}
}

func ptr(s string) *string { return &s }

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}
