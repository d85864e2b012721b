package main

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/jaegertest"
	"github.com/walrelay/walrelay/outbox"
)

// TestTracingEnabled: with WALRELAY_TRACING_ENABLED and the OTEL_*
// variables, walrelay run exports a WAL wait and a publish span of service
// walrelay for a row with a trace context, by OTLP/HTTP; neither its log
// nor walrelay config shows the OTLP headers' values or the endpoint's
// password.
func TestTracingEnabled(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	conn := connect(t, pg.DSN)
	if _, err := conn.Exec(t.Context(), "ALTER TABLE public.outbox ADD COLUMN trace text"); err != nil {
		t.Fatal(err)
	}
	rcv := jaegertest.StartReceiver(t)
	const secret = "s3cret-token"
	e := baseEnv(pg, kc).with("WALRELAY_OUTBOX_TRACE_COLUMN", "trace", "WALRELAY_TRACING_ENABLED", "true",
		"OTEL_EXPORTER_OTLP_ENDPOINT", strings.Replace(rcv.OTLPHTTP, "http://", "http://user:"+secret+"@", 1),
		"OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20"+secret, "OTEL_BSP_SCHEDULE_DELAY", "50")
	p := streaming(t, e)
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	if _, err := conn.Exec(t.Context(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, trace) VALUES ($1, 'order', 'o-1', 'Created', '{}', $2)`,
		outbox.NewID(), "00-"+traceID+"-b7ad6b7169203331-01"); err != nil {
		t.Fatal(err)
	}
	var spans []jaegertest.Span
	deadline := time.Now().Add(30 * time.Second)
	for len(spans) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d spans of trace %s after 30 s, want 2", len(spans), traceID)
		}
		time.Sleep(50 * time.Millisecond)
		var err error
		if spans, err = rcv.Trace(t.Context(), traceID); err != nil && !errors.Is(err, jaegertest.ErrNoTrace) {
			t.Fatal(err)
		}
	}
	names := map[string]bool{}
	for _, s := range spans {
		if s.Service != "walrelay" {
			t.Errorf("span %q of service %q, want walrelay", s.OperationName, s.Service)
		}
		names[s.OperationName] = true
	}
	if !names["wal wait"] || !names["send "+kc.topic("order")] {
		t.Errorf("spans %v, want wal wait and send %s", names, kc.topic("order"))
	}
	code, out := runCmd(t, e, "config")
	if code != 0 {
		t.Fatalf("walrelay config: exit %d:\n%s", code, out)
	}
	if !strings.Contains(out, "enabled: true # from WALRELAY_TRACING_ENABLED") {
		t.Errorf("walrelay config does not show tracing.enabled:\n%s", out)
	}
	p.signal(syscall.SIGTERM)
	if p.exit(30*time.Second) != 0 {
		t.Errorf("walrelay did not stop cleanly")
	}
	for what, text := range map[string]string{"run's log": p.out.String(), "config's output": out} {
		if strings.Contains(text, secret) {
			t.Errorf("%s shows the OTLP secret:\n%s", what, text)
		}
	}
}
