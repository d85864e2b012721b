package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/jaegertest"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/outbox"
)

// TestTracingEnabled: with WALRELAY_TRACING_ENABLED and the OTEL_*
// variables, walrelay run exports a WAL wait and a publish span of service
// walrelay for a row with a trace context, by OTLP/HTTP; neither its log
// nor walrelay config shows the OTLP headers' values.
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
		"OTEL_EXPORTER_OTLP_ENDPOINT", rcv.OTLPHTTP, // credentials in it are refused (TestTracingRefusesUnreadableOTLPSettings)
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
// walrelay is killed with SIGKILL once the first records are on the topic,
// their acknowledgements in flight and rows still arriving; started
// again, it sends the rest. Every `send` span exported (before the kill or
// after) that claims an offset names a record really on the topic there,
// with the span's event id and the span's own traceparent; and every event
// has at least one such span, unless the killed walrelay had it
// acknowledged and confirmed (its span ended, not yet exported, lost:
// spans are never held for) and the restart did not send it. In exactly-once mode the topic is read with
// read_committed isolation, so a span claiming a record of a transaction
// that was aborted (or never committed: killed) names no record; an event
// whose committing span was lost with the process (ended, not yet
// exported) may instead have a span with walrelay.skipped (the restart
// found it committed). There walrelay kills itself (the faultinject build)
// after its first transaction's records and position record were flushed
// and acknowledged by the broker, before the commit: those records are on
// the topic, uncommitted, and their spans must not be exported (long(t):
// the build).
func TestTracingSIGKILL(t *testing.T) {
	long(t) // a slow broker and a SIGKILL; TestTracingEnabled checks the spans in the default suite
	t.Parallel()
	tracingSIGKILL(t, false)
}

// TestTracingSIGKILLExactlyOnce is TestTracingSIGKILL in exactly-once
// mode.
func TestTracingSIGKILLExactlyOnce(t *testing.T) {
	long(t) // builds the faultinject binary
	t.Parallel()
	tracingSIGKILL(t, true)
}

func tracingSIGKILL(t *testing.T, eos bool) {
	pg, kc, col := setup(t)
	network := kc.net(t)
	conn := connect(t, pg.DSN)
	if _, err := conn.Exec(t.Context(), "ALTER TABLE public.outbox ADD COLUMN trace text"); err != nil {
		t.Fatal(err)
	}
	rcv := jaegertest.StartReceiver(t)
	base, raw := baseEnv(pg, kc), col // raw: every record, committed or not
	if eos {
		base, col = eosEnv(pg, kc), committedCollector(t, kc)
	}
	e := base.with("WALRELAY_OUTBOX_TRACE_COLUMN", "trace", "WALRELAY_TRACING_ENABLED", "true",
		"OTEL_EXPORTER_OTLP_ENDPOINT", rcv.OTLPHTTP, "OTEL_BSP_SCHEDULE_DELAY", "20")
	var p *proc
	if eos {
		// It kills itself in its first transaction, its records produced
		// and acknowledged by the broker, its position record flushed,
		// before the commit.
		bin, err := faultBin()
		if err != nil {
			t.Fatal(err)
		}
		p = startBin(t, bin, e.with("WALRELAY_FAULT_KILL_AT", "txn_position_flushed:1"), "run")
		p.waitLog("msg=streaming", 60*time.Second)
	} else {
		p = streaming(t, e)
	}
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
	skipped := map[string]bool{}
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
				if s.Tag("walrelay.skipped") == "true" {
					skipped[id] = true
				}
			}
		}
		return acked
	}
	if eos {
		if code := p.exit(60 * time.Second); code != -1 {
			t.Fatalf("exit %d, want killed by SIGKILL in its first transaction:\n%s", code, tail(p.out.String(), 2000))
		}
	} else {
		// Killed as soon as the first records are on the topic, while the
		// broker's answers are late: acknowledgements are in flight.
		for deadline := time.Now().Add(10 * time.Second); len(raw.Records()) == 0; {
			if time.Now().After(deadline) {
				t.Fatal("no record on the topic within 10 s")
			}
			time.Sleep(5 * time.Millisecond)
		}
		p.kill()
	}
	before := sends()
	// The end of each partition once the requests in flight landed: a
	// record below it was produced by the killed walrelay.
	time.Sleep(time.Second)
	ends := endOffsets(t, kc.Addrs(), kc.topic("order"))
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
	spans, lost := 0, 0
	for _, id := range ids {
		if len(acked[id]) == 0 && !skipped[id] {
			// Its span may have ended and been lost with the killed
			// process (spans are not held for): then every record of it
			// is the killed walrelay's, and the restart did not send it.
			for _, r := range col.Records() {
				if string(kafkatest.Header(r, "id")) == id && r.Offset >= ends[r.Partition] {
					t.Errorf("event %s: no send span with an acknowledged offset, and a record at partition %d offset %d sent after the restart", id, r.Partition, r.Offset)
				}
			}
			lost++
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
	all := 0
	for _, r := range raw.Records() {
		if r.Topic == kc.topic("order") {
			all++
		}
	}
	t.Logf("%d events, %d with an acked send span exported before the SIGKILL; %d acked send spans in all, %d events with a skipped span, %d events acked before the kill whose span was lost with it; %d records on the topic (%d read committed)", n, len(before), spans, len(skipped), lost, all, len(onTopic))
}

// endOffsets returns the end offset of each partition of topic.
func endOffsets(t *testing.T, addrs []string, topic string) map[int32]int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	lo, err := kadm.NewClient(cl).ListEndOffsets(t.Context(), topic)
	if err != nil {
		t.Fatal(err)
	}
	ends := map[int32]int64{}
	lo.Each(func(o kadm.ListedOffset) { ends[o.Partition] = o.Offset })
	return ends
}

// TestTracingRootSpans: with WALRELAY_TRACING_ROOT_SPANS, a row without a
// trace context starts a new trace: its record carries a traceparent whose
// trace walrelay exported, the send span as its root.
func TestTracingRootSpans(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	if _, err := conn.Exec(t.Context(), "ALTER TABLE public.outbox ADD COLUMN trace text"); err != nil {
		t.Fatal(err)
	}
	rcv := jaegertest.StartReceiver(t)
	e := baseEnv(pg, kc).with("WALRELAY_OUTBOX_TRACE_COLUMN", "trace", "WALRELAY_TRACING_ENABLED", "true", "WALRELAY_TRACING_ROOT_SPANS", "true",
		"OTEL_EXPORTER_OTLP_ENDPOINT", rcv.OTLPHTTP, "OTEL_BSP_SCHEDULE_DELAY", "20")
	p := streaming(t, e)
	id := outbox.NewID()
	if _, err := conn.Exec(t.Context(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'o-1', 'Created', '{}')`, id); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, []string{id}, 30*time.Second)
	p.signal(syscall.SIGTERM)
	if p.exit(30*time.Second) != 0 {
		t.Errorf("walrelay did not stop cleanly")
	}
	tp := strings.Split(string(kafkatest.Header(col.Records()[0], "traceparent")), "-")
	if len(tp) != 4 {
		t.Fatalf("record's traceparent %q, want a new trace's", strings.Join(tp, "-"))
	}
	spans, err := rcv.Trace(t.Context(), tp[1])
	if err != nil {
		t.Fatalf("trace %s of the record: %v", tp[1], err)
	}
	for _, s := range spans {
		if s.SpanID == tp[2] && (s.OperationName != "send "+kc.topic("order") || len(s.References) != 0) {
			t.Errorf("the record's span %q has references %v, want a root send span", s.OperationName, s.References)
		}
	}
	if len(spans) != 2 {
		t.Errorf("%d spans in the new trace, want 2 (send, wal wait)", len(spans))
	}
}
