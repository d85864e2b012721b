package inbox

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestProcessSpanKeyAttribute: the process span carries the record's key
// as messaging.kafka.message.key only when it is UTF-8 (an Avro or other
// binary key would make protobuf refuse the span, and the OTLP exporter
// fail the whole batch holding it), cut to 256 bytes on a character
// boundary (the user's TracerProvider may set no limit); an event id that
// is not UTF-8 is left out likewise.
func TestProcessSpanKeyAttribute(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes
	tests := []struct {
		name    string
		key, id string
		wantKey string // "" : no key attribute
		wantID  string
	}{
		{"text", "order-1", "e1", "order-1", "e1"},
		{"avro", string(append([]byte{0, 0, 0, 0, 200, 14}, "order-1"...)) + "\xff", "e1", "", "e1"},
		{"long", long, "e1", long[:256], "e1"},
		{"id not UTF-8", "order-1", "e\xff", "order-1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			c := &Consumer{tracer: tp.Tracer(scopeName), cfg: Config{Group: "g"}}
			r := &kgo.Record{Topic: "orders", Key: []byte(tt.key), Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}}}
			_, span := c.startSpan(t.Context(), r, tt.id)
			span.End()
			spans := rec.Ended()
			if len(spans) != 1 {
				t.Fatalf("%d spans", len(spans))
			}
			got := map[string]string{}
			for _, a := range spans[0].Attributes() {
				s := a.Value.String()
				if !utf8.ValidString(s) {
					t.Errorf("attribute %s = %q is not UTF-8", a.Key, s)
				}
				got[string(a.Key)] = s
			}
			if got["messaging.kafka.message.key"] != tt.wantKey || got["messaging.message.id"] != tt.wantID {
				t.Errorf("key %q id %q, want key %q id %q", got["messaging.kafka.message.key"], got["messaging.message.id"], tt.wantKey, tt.wantID)
			}
			srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			defer srv.Close()
			exp, err := otlptracehttp.New(t.Context(), otlptracehttp.WithEndpointURL(srv.URL))
			if err != nil {
				t.Fatal(err)
			}
			if err := exp.ExportSpans(t.Context(), spans); err != nil {
				t.Errorf("the OTLP export of the batch holding this span fails: %v", err)
			}
		})
	}
}

// TestProcessSpanErrorTextUTF8: a handler's error that quotes bytes that
// are not UTF-8 (a binary key, a payload) ends the span with the text
// made valid (U+FFFD), in its status and its exception event: the OTLP
// exporter would otherwise fail the whole batch holding the span.
func TestProcessSpanErrorTextUTF8(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := tp.Tracer(scopeName)
	_, failed := tr.Start(t.Context(), "process orders")
	_, undone := tr.Start(t.Context(), "process orders")
	bad := errors.New("no order for key \xff\xfe")
	endSpans([]openSpan{{failed, 0}, {undone, 1}}, 0, 0, bad, bad)
	_, dl := tr.Start(t.Context(), "process orders")
	endDeadLetterSpan(dl, "handler_failed", bad)
	for _, s := range rec.Ended() {
		if !utf8.ValidString(s.Status().Description) {
			t.Errorf("status %q is not UTF-8", s.Status().Description)
		}
		for _, ev := range s.Events() {
			for _, a := range ev.Attributes {
				if !utf8.ValidString(a.Value.String()) {
					t.Errorf("event %s: %s = %q is not UTF-8", ev.Name, a.Key, a.Value.String())
				}
			}
		}
	}
}
