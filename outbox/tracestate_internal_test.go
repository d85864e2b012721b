package outbox

import (
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/walrelay/walrelay/internal/properties"
)

// TestTracestateSurvivesTheTraceColumn: the trace column's Properties text
// reads back, as walrelay's decoder reads it, as the very tracestate the
// caller had: a tracestate value may hold a backslash (W3C allows 0x5C),
// which Properties would otherwise read as an escape ("\n" a newline).
func TestTracestateSurvivesTheTraceColumn(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	for _, st := range []string{`v=plain`, `v=a\nb`, `v=C:\dir`, `v=x\u0041`, `v=end\`, `a=#x,b=!y:z`} {
		ts, err := trace.ParseTraceState(st)
		if err != nil {
			t.Fatalf("%q: not a valid tracestate: %v", st, err)
		}
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts})
		v := traceValue(trace.ContextWithSpanContext(t.Context(), sc))
		props, err := properties.Parse([]byte(v))
		if err != nil {
			t.Fatal(err)
		}
		if got := props["tracestate"]; got != ts.String() {
			t.Errorf("tracestate %q written as %q, read back by the decoder as %q", ts.String(), v, got)
		}
		if got, want := props["traceparent"], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"; got != want {
			t.Errorf("traceparent read back as %q, want %q", got, want)
		}
	}
}
