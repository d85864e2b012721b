package tracing_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/testkit/jaegertest"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/outbox"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/sink"
	"github.com/walrelay/walrelay/tracing"
)

// backend is where the spans go over OTLP/HTTP, and where the test reads
// them back.
type backend interface {
	Trace(ctx context.Context, id string) ([]jaegertest.Span, error)
}

// TestTraceEndToEnd: one trace from the writer's transaction to the
// consumer's handler, exported over OTLP/HTTP to an in-process receiver
// (TestTraceInJaeger does the same against a real Jaeger).
func TestTraceEndToEnd(t *testing.T) {
	r := jaegertest.StartReceiver(t)
	traceEndToEnd(t, r.OTLPHTTP, r)
}

// TestTraceInJaeger is TestTraceEndToEnd against a real Jaeger v2 (built
// from tools/jaeger on first use), read back from its query API. Gated:
// WALRELAY_TEST_JAEGER=1 (.ci/run).
func TestTraceInJaeger(t *testing.T) {
	if os.Getenv(jaegertest.Env) != "1" {
		t.Skip("set " + jaegertest.Env + "=1 to run against a real Jaeger (built from tools/jaeger on first use)")
	}
	j := jaegertest.Start(t)
	traceEndToEnd(t, j.OTLPHTTP, j)
}

// provider is an SDK provider of the test's own (the writer's service, the
// consumer's), exporting by OTLP/HTTP as the environment says.
func provider(t *testing.T, service string) *sdktrace.TracerProvider {
	t.Helper()
	exp, err := otlptracehttp.New(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(100*time.Millisecond)),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(service))))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

// traceEndToEnd writes three events with package outbox in a request's
// span (two to the order topic, one that walrelay dead-letters), relays
// them with tracing on, handles them with package inbox, and reads the
// trace back: the request's span; under it, for each event, walrelay's WAL
// wait and publish spans (the dead letter's in error, with its reason); and
// under each publish span, the consumer's process span.
func traceEndToEnd(t *testing.T, endpoint string, b backend) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	ctx := t.Context()
	const topic = "outbox.event.order"
	pg := pgtest.Start(t)
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	layout := decoder.Layout{TraceColumn: "trace"}
	if _, err := migrations.Apply(ctx, conn, decoder.Config{Layout: layout}); err != nil {
		t.Fatal(err)
	}
	kc := kafkatest.Start(t, kfake.SeedTopics(1, topic))

	// walrelay, with tracing as the OTEL_* environment says.
	tr, err := tracing.New(ctx, tracing.Config{Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(relay.Config{ConnString: pg.DSN, CreateSlot: true, Outbox: decoder.Config{Layout: layout},
		Sink: sink.Config{Brokers: kc.Addrs(), Tracer: tr}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	relayed := make(chan error, 1)
	go func() { relayed <- rl.Run(rctx) }()
	defer func() {
		stop()
		<-relayed
		_ = tr.Shutdown(context.Background())
	}()
	for deadline := time.Now().Add(time.Minute); rl.State() != "streaming"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("walrelay not streaming after a minute: %s", rl.State())
		}
	}

	// The writer: a request's span, the rows written in it.
	writerTP := provider(t, "shop")
	reqCtx, req := writerTP.Tracer("shop").Start(ctx, "POST /orders")
	w, err := outbox.New(outbox.Config{Layout: layout})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := w.WriteBatch(reqCtx, tx, []outbox.Event{
		{AggregateType: "order", AggregateID: "o-1", Type: "OrderPlaced", Payload: []byte(`{"n":1}`)},
		{AggregateType: "order", AggregateID: "o-1", Type: "OrderPaid", Payload: []byte(`{"n":2}`)},
		{AggregateType: "no such topic", AggregateID: "o-1", Type: "Oops", Payload: []byte(`{}`)}, // dead-lettered: invalid_topic
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	req.End()
	traceID := req.SpanContext().TraceID().String()

	// The consumer.
	pool, err := pgxpool.New(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := inbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	consumerTP := provider(t, "shipping")
	c, err := inbox.New(inbox.Config{Postgres: pool, Brokers: kc.Addrs(), Topics: []string{topic}, Group: "shipping",
		TracerProvider: consumerTP, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handled := map[string]bool{}
	cctx, stopConsumer := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() {
		consumed <- c.Run(cctx, func(_ context.Context, _ pgx.Tx, m inbox.Message) error {
			mu.Lock()
			handled[m.ID] = true
			mu.Unlock()
			return nil
		})
	}()
	defer func() {
		stopConsumer()
		<-consumed
	}()

	// Read the trace back until it holds every span: the request's, two
	// per event (WAL wait, publish), one per event consumed (process).
	const want = 1 + 3*2 + 2
	var spans []jaegertest.Span
	deadline := time.Now().Add(45 * time.Second)
	for {
		_ = tr.ForceFlush(ctx)
		_ = consumerTP.ForceFlush(ctx)
		_ = writerTP.ForceFlush(ctx)
		spans, err = b.Trace(ctx, traceID)
		if err != nil && !errors.Is(err, jaegertest.ErrNoTrace) {
			t.Fatal(err)
		}
		if len(spans) >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	mu.Lock()
	t.Logf("handled %v; %d spans in trace %s", handled, len(spans), traceID)
	mu.Unlock()
	checkTrace(t, spans, want, ids)
}

// checkTrace checks the relations and attributes of the trace's spans.
func checkTrace(t *testing.T, spans []jaegertest.Span, want int, ids []string) {
	t.Helper()
	byID := map[string]jaegertest.Span{}
	for _, s := range spans {
		byID[s.SpanID] = s
		t.Logf("span %s %-28q service %-8s parent %v tags %v", s.SpanID, s.OperationName, s.Service, s.References, s.Tags)
	}
	if len(spans) != want {
		t.Fatalf("%d spans in the trace, want %d", len(spans), want)
	}
	parent := func(s jaegertest.Span) (jaegertest.Span, bool) {
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" {
				p, ok := byID[r.SpanID]
				return p, ok
			}
		}
		return jaegertest.Span{}, false
	}
	// For each event id: its spans by name.
	perEvent := map[string]map[string]jaegertest.Span{}
	for _, s := range spans {
		id := s.Tag("messaging.message.id")
		if id == "" {
			continue
		}
		if perEvent[id] == nil {
			perEvent[id] = map[string]jaegertest.Span{}
		}
		perEvent[id][s.Service+" "+s.Tag("messaging.operation.type")] = s
	}
	for i, id := range ids {
		send, ok := perEvent[id]["walrelay send"]
		if !ok {
			t.Errorf("event %s: no walrelay publish span", id)
			continue
		}
		req, ok := parent(send)
		if !ok || req.OperationName != "POST /orders" || req.Service != "shop" {
			t.Errorf("event %s: publish span's parent %+v, want the request's span", id, req)
		}
		if send.Tag("span.kind") != "producer" || send.Tag("messaging.system") != "kafka" || send.Tag("walrelay.lsn") == "" {
			t.Errorf("event %s: publish span %q tags %v", id, send.OperationName, send.Tags)
		}
		var wait jaegertest.Span
		for _, s := range spans {
			if s.OperationName == tracing.SpanWALWait && s.Tag("walrelay.lsn") == send.Tag("walrelay.lsn") {
				wait = s
			}
		}
		if p, ok := parent(wait); !ok || p.SpanID != req.SpanID {
			t.Errorf("event %s: WAL wait span %+v, want one under the request's span", id, wait)
		}
		if i == 2 { // dead-lettered
			if send.Tag("walrelay.dead_letter.reason") != "invalid_topic" || send.Tag("otel.status_code") != "ERROR" || send.OperationName != "send walrelay.dlq" {
				t.Errorf("dead-lettered event %s: publish span %q tags %v", id, send.OperationName, send.Tags)
			}
			continue
		}
		if send.OperationName != "send outbox.event.order" || send.Tag("messaging.kafka.offset") != []string{"0", "1"}[i] || send.Tag("messaging.destination.partition.id") != "0" {
			t.Errorf("event %s: publish span %q tags %v", id, send.OperationName, send.Tags)
		}
		proc, ok := perEvent[id]["shipping process"]
		if !ok {
			t.Errorf("event %s: no consumer process span", id)
			continue
		}
		if p, ok := parent(proc); !ok || p.SpanID != send.SpanID {
			t.Errorf("event %s: process span's parent %+v, want walrelay's publish span", id, p)
		}
		if proc.Tag("span.kind") != "consumer" || proc.Tag("otel.status_code") == "ERROR" {
			t.Errorf("event %s: process span %q tags %v", id, proc.OperationName, proc.Tags)
		}
	}
}
