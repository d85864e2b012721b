package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/jaegertest"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
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

// TestTracingSIGKILL: rows with a trace context each (one trace per row)
// are written, one every 20 ms, while the broker answers 300 ms late, and
// walrelay is killed with SIGKILL once the first spans are out, with events
// in flight and rows still arriving; started
// again, it sends the rest. Every `send` span exported (before the kill or
// after) that claims an offset names a record really on the topic there,
// with the span's event id and the span's own traceparent; and every event
// has at least one such span.
func TestTracingSIGKILL(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	network := kc.net(t)
	conn := connect(t, pg.DSN)
	if _, err := conn.Exec(t.Context(), "ALTER TABLE public.outbox ADD COLUMN trace text"); err != nil {
		t.Fatal(err)
	}
	rcv := jaegertest.StartReceiver(t)
	e := baseEnv(pg, kc).with("WALRELAY_OUTBOX_TRACE_COLUMN", "trace", "WALRELAY_TRACING_ENABLED", "true",
		"OTEL_EXPORTER_OTLP_ENDPOINT", rcv.OTLPHTTP, "OTEL_BSP_SCHEDULE_DELAY", "20")
	p := streaming(t, e)
	network.Slow(300 * time.Millisecond)
	const n = 60
	traceOf := map[string]string{} // event id -> trace id
	var ids []string
	for i := range n {
		id := outbox.NewID()
		traceOf[id] = fmt.Sprintf("%032x", 0xa1000+i)
		ids = append(ids, id)
	}
	// One row every 20 ms: walrelay is killed while they still arrive,
	// with produce requests in flight.
	wrote := make(chan error, 1)
	go func() {
		wconn := connect(t, pg.DSN)
		for i, id := range ids {
			if _, err := wconn.Exec(t.Context(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, trace) VALUES ($1, 'order', $2, 'Created', '{}', $3)`,
				id, fmt.Sprintf("o-%d", i%7), "00-"+traceOf[id]+"-b7ad6b7169203331-01"); err != nil {
				wrote <- err
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		wrote <- nil
	}()
	sends := func() (acked map[string][]jaegertest.Span) {
		acked = map[string][]jaegertest.Span{}
		for id, trace := range traceOf {
			spans, err := rcv.Trace(t.Context(), trace)
			if err != nil && !errors.Is(err, jaegertest.ErrNoTrace) {
				t.Fatal(err)
			}
			for _, s := range spans {
				if strings.HasPrefix(s.OperationName, "send ") && s.Tag("messaging.kafka.offset") != "" {
					acked[id] = append(acked[id], s)
				}
			}
		}
		return acked
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(sends()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no send span within 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.kill()
	before := sends()
	network.Up()
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	p = streaming(t, e)
	waitAll(t, col, ids, time.Minute)
	// A clean stop exports the spans queued.
	p.signal(syscall.SIGTERM)
	if p.exit(30*time.Second) != 0 {
		t.Errorf("walrelay did not stop cleanly")
	}
	acked := sends()
	type at struct {
		partition string
		offset    int64
	}
	onTopic := map[at]*kgo.Record{}
	for _, r := range col.Records() {
		if r.Topic == kc.topic("order") {
			onTopic[at{strconv.Itoa(int(r.Partition)), r.Offset}] = r
		}
	}
	spans := 0
	for _, id := range ids {
		if len(acked[id]) == 0 {
			t.Errorf("event %s: no send span with an acknowledged offset", id)
		}
		for _, s := range acked[id] {
			spans++
			off, err := strconv.ParseInt(s.Tag("messaging.kafka.offset"), 10, 64)
			if err != nil {
				t.Fatalf("span %s: offset %q", s.SpanID, s.Tag("messaging.kafka.offset"))
			}
			r := onTopic[at{s.Tag("messaging.destination.partition.id"), off}]
			switch {
			case s.OperationName != "send "+kc.topic("order") || s.Tag("messaging.message.id") != id:
				t.Errorf("span %s %q of event %s claims message %s", s.SpanID, s.OperationName, id, s.Tag("messaging.message.id"))
			case r == nil:
				t.Errorf("span %s of event %s claims partition %s offset %d: no record there", s.SpanID, id, s.Tag("messaging.destination.partition.id"), off)
			case string(kafkatest.Header(r, "id")) != id:
				t.Errorf("span %s of event %s claims partition %s offset %d: the record there is event %s", s.SpanID, id, s.Tag("messaging.destination.partition.id"), off, kafkatest.Header(r, "id"))
			case string(kafkatest.Header(r, "traceparent")) != "00-"+traceOf[id]+"-"+s.SpanID+"-01":
				t.Errorf("span %s of event %s: the record at its offset carries traceparent %s", s.SpanID, id, kafkatest.Header(r, "traceparent"))
			}
		}
	}
	t.Logf("%d events, %d with an acked send span exported before the SIGKILL; %d acked send spans in all, %d records on the topic", n, len(before), spans, len(onTopic))
}
