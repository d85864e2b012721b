package inbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
)

// TestProcessSpans: with a TracerProvider, each record's handling is a
// consumer span, a child of the span its traceparent names (walrelay's
// publish span), current in the handler's context, ended once its
// transaction committed; a duplicate skipped and a dead letter are spans
// that say so.
func TestProcessSpans(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	traced := func(r *kgo.Record) *kgo.Record {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: "traceparent", Value: []byte(parent)})
		return r
	}
	e.produce(t, traced(event("e1", "k", 1)), traced(event("e1", "k", 1)), traced(event("bad", "k", 2)))
	var mu sync.Mutex
	inHandler := map[string]trace.SpanContext{}
	e.start(t, inbox.Config{MaxAttempts: 1, TracerProvider: tp, RetryBackoffMin: time.Millisecond}, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		mu.Lock()
		inHandler[m.ID] = trace.SpanContextFromContext(ctx)
		mu.Unlock()
		if m.ID == "bad" {
			return errors.New("no such order")
		}
		return record(ctx, tx, m)
	})
	waitfor.Until(t, 30*time.Second, "4 process spans", func() bool { return len(rec.Ended()) >= 4 })
	byOffset := map[int64][]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		if s.Name() != "process "+topic || s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("span %q kind %v", s.Name(), s.SpanKind())
		}
		if s.Parent().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || s.Parent().SpanID().String() != "00f067aa0ba902b7" {
			t.Errorf("span %q parent %v: want the record's", s.Name(), s.Parent())
		}
		var off int64 = -1
		for _, a := range s.Attributes() {
			if a.Key == "messaging.kafka.offset" {
				off = a.Value.AsInt64()
			}
		}
		byOffset[off] = append(byOffset[off], s)
	}
	attr := func(s sdktrace.ReadOnlySpan, k string) string {
		for _, a := range s.Attributes() {
			if string(a.Key) == k {
				return a.Value.String()
			}
		}
		return ""
	}
	if s := byOffset[0]; len(s) != 1 || s[0].Status().Code != codes.Unset || attr(s[0], "messaging.message.id") != "e1" || !s[0].SpanContext().Equal(inHandler["e1"]) {
		t.Errorf("handled record's spans %v (handler saw %v)", s, inHandler["e1"])
	}
	if s := byOffset[1]; len(s) != 1 || attr(s[0], "walrelay.inbox.duplicate") != "true" {
		t.Errorf("duplicate's spans %v", s)
	}
	if s := byOffset[2]; len(s) != 2 || s[0].Status().Code != codes.Error || s[1].Status().Code != codes.Error || attr(s[1], "walrelay.dead_letter.reason") != "handler_failed" {
		t.Errorf("dead letter's spans: %d", len(s))
		for _, x := range s {
			t.Logf("  %q status %v attrs %v", x.Name(), x.Status(), x.Attributes())
		}
	}
}
