package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/noredirect"
	"github.com/walrelay/walrelay/sink"
)

// ScopeName is the instrumentation scope of walrelay's spans.
const ScopeName = "github.com/walrelay/walrelay"

// Span names and walrelay's attributes.
const (
	SpanWALWait = "wal wait" // from the commit to walrelay reading the event
	// AttrLSN is the event's own WAL position, AttrCommitLSN its
	// transaction's commit position, AttrXid its transaction id, AttrTable
	// its outbox table ("schema.table", or "message").
	AttrLSN       = attribute.Key("walrelay.lsn")
	AttrCommitLSN = attribute.Key("walrelay.commit_lsn")
	AttrXid       = attribute.Key("walrelay.xid")
	AttrTable     = attribute.Key("walrelay.table")
	// AttrDeadLetter is the reason of an event that went to the
	// dead-letter topic, and AttrSkipped is true for one an earlier Kafka
	// transaction committed (exactly-once mode).
	AttrDeadLetter = attribute.Key("walrelay.dead_letter.reason")
	AttrSkipped    = attribute.Key("walrelay.skipped")
)

// DefaultQueueSize is how many ended spans wait for the exporter, at most,
// by default: beyond, they are dropped.
const DefaultQueueSize = 4096

// Config configures New.
type Config struct {
	// Enabled turns tracing on; New returns nil otherwise.
	Enabled bool
	// QueueSize bounds the spans waiting for the exporter. Default
	// DefaultQueueSize.
	QueueSize int
	// Exporter, if set, is used instead of the OTLP exporter that the
	// OTEL_* environment variables configure.
	Exporter sdktrace.SpanExporter
	// Logger receives the one line logged when spans are first dropped.
	// Nil is slog.Default().
	Logger *slog.Logger
	// RootSpans starts a new trace (a root publish span, sampled by the
	// configured sampler) for an event without a trace context. By
	// default (false) such an event starts no trace.
	RootSpans bool
}

// Tracing is walrelay's tracer: it implements sink.Tracer. A nil *Tracing
// is off.
type Tracing struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	q      *queue
	roots  bool
	// parentBased is true when the sampler follows the writer's sampled
	// flag: Publish then reads the flag itself and returns at once for an
	// unsampled trace.
	parentBased bool
	resent      resent
}

var _ sink.Tracer = (*Tracing)(nil)

// New sets up tracing as cfg and the OTEL_* environment say, or returns
// nil if cfg.Enabled is false. Shutdown flushes and stops it.
func New(ctx context.Context, cfg Config) (*Tracing, error) {
	if !cfg.Enabled {
		return nil, nil
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// Before the exporter reads the environment: what OpenTelemetry
	// reports goes to the log, without the values it names.
	routeOTelLogs(cfg.Logger)
	sampler, parentBased, err := samplerFromEnv()
	if err != nil {
		return nil, err
	}
	exp := cfg.Exporter
	if exp == nil {
		if err := checkOTLPEnv(); err != nil {
			return nil, err
		}
		if exp, err = otlpExporter(ctx); err != nil {
			return nil, err
		}
	}
	// The service name defaults to walrelay; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES (merged after) win.
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName("walrelay")), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil && res == nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	q := newQueue(cfg.QueueSize, &counting{SpanExporter: exp}, cfg.Logger)
	// The sampler is OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG's,
	// else parentbased_always_on.
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSpanProcessor(q), sdktrace.WithSampler(sampler),
		sdktrace.WithRawSpanLimits(spanLimits()))
	return &Tracing{tp: tp, tracer: tp.Tracer(ScopeName), q: q, roots: cfg.RootSpans, parentBased: parentBased}, nil
}

// otlpExporter is the OTLP exporter of OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
// (or OTEL_EXPORTER_OTLP_PROTOCOL): grpc or http/protobuf (the default, as
// the specification says). The exporter reads the endpoint, headers, TLS
// and timeout variables itself; the OTLP/HTTP one is given walrelay's
// client, which reads the TLS and timeout ones as it would
// (otlpHTTPClient).
func otlpExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch strings.TrimSpace(proto) {
	case "", "http/protobuf":
		// No redirect is followed: Go's client would send the headers of
		// OTEL_EXPORTER_OTLP_HEADERS (all but Authorization to another
		// host, all to the same host) where the endpoint points, and take
		// the answer there for the endpoint's. otlpHTTPClient says why
		// the exporter is given a client. gRPC follows none.
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithHTTPClient(otlpHTTPClient()))
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("tracing: OTLP protocol %q: want grpc or http/protobuf", proto)
	}
	if err != nil {
		// The error is the exporter's: it names no header value.
		return nil, fmt.Errorf("tracing: OTLP exporter (%s): %w", proto, err)
	}
	return exp, nil
}

// Dropped is how many spans were dropped: the queue full, or the exporter
// failed. Zero on a nil Tracing.
func (t *Tracing) Dropped() uint64 {
	if t == nil {
		return 0
	}
	return t.q.dropped.Load()
}

// ForceFlush exports the spans ended so far, within ctx. A nil Tracing does
// nothing.
func (t *Tracing) ForceFlush(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if err := t.tp.ForceFlush(ctx); err != nil {
		return fmt.Errorf("tracing: flush: %w", err)
	}
	return nil
}

// Shutdown exports the spans queued, within ctx, and stops. A nil Tracing
// does nothing.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if err := t.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// TracerProvider is the provider of walrelay's spans (nil on a nil
// Tracing).
func (t *Tracing) TracerProvider() trace.TracerProvider {
	if t == nil {
		return nil
	}
	return t.tp
}

var propagator = propagation.TraceContext{}

// Publish implements sink.Tracer: it ends the WAL wait span of e (from its
// commit time to now) and starts its publish span, both children of the
// writer's span; end ends the publish span with the event's fate. A
// traceparent that does not parse, or a trace the sampler does not sample
// (by default: one the writer did not sample), starts nothing (end nil):
// the record keeps the writer's traceparent. An event without a trace
// context (traceparent nil) starts nothing unless Config.RootSpans: then
// its publish span is the root of a new trace (as the sampler decides),
// with the WAL wait as its child.
func (t *Tracing) Publish(e *event.Event, traceparent, tracestate []byte) ([]byte, func(sink.Delivery, error)) {
	root := traceparent == nil
	if root && !t.roots {
		return nil, nil // first: no cost for an event without a context
	}
	if t.parentBased && unsampled(traceparent) {
		return nil, nil
	}
	ctx := context.Background()
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}
	if root {
		opts = append(opts, trace.WithNewRoot())
	} else {
		carrier := propagation.MapCarrier{"traceparent": string(traceparent)}
		if tracestate != nil {
			carrier["tracestate"] = string(tracestate)
		}
		ctx = propagator.Extract(ctx, carrier)
		if !trace.SpanContextFromContext(ctx).IsValid() {
			return nil, nil
		}
	}
	now := time.Now()
	pctx, span := t.tracer.Start(ctx, "send", append(opts, trace.WithTimestamp(now))...)
	if root {
		ctx = pctx // the WAL wait is the root's child
	}
	if !span.IsRecording() {
		// Not sampled: the record keeps the writer's context. (Under a
		// parent-based sampler an unsampled writer's event returned
		// above, allocating nothing; here, the sampler's own decision.)
		return nil, nil
	}
	common := []attribute.KeyValue{
		AttrLSN.String(e.WALStart.String()), AttrCommitLSN.String(e.CommitLSN.String()),
		AttrXid.Int64(int64(e.Xid)), AttrTable.String(validText(e.Source)),
	}
	resent := t.resent.take(e.Position())
	if !e.CommitTime.IsZero() && e.CommitTime.Before(now) && !resent {
		_, wait := t.tracer.Start(ctx, SpanWALWait, trace.WithTimestamp(e.CommitTime), trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(append(common, semconv.DBSystemNamePostgreSQL)...))
		wait.End(trace.WithTimestamp(now))
	}
	span.SetAttributes(append(common, semconv.MessagingSystemKafka, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("send"))...)
	if utf8.ValidString(e.ID) {
		span.SetAttributes(semconv.MessagingMessageID(e.ID))
	}
	// A key that is not UTF-8 (a SQL_ASCII database) is left out: the
	// OTLP exporter would fail the whole batch holding it. Its length is
	// bounded by the span limits.
	if e.AggregateID != "" && utf8.ValidString(e.AggregateID) {
		span.SetAttributes(semconv.MessagingKafkaMessageKey(e.AggregateID))
	}
	out := propagation.MapCarrier{}
	propagator.Inject(pctx, out)
	return []byte(out["traceparent"]), func(d sink.Delivery, err error) {
		topic := validText(d.Topic)
		span.SetName("send " + topic)
		span.SetAttributes(semconv.MessagingDestinationName(topic))
		if d.Partition >= 0 {
			span.SetAttributes(semconv.MessagingDestinationPartitionID(fmt.Sprint(d.Partition)))
		}
		switch {
		case err != nil:
			t.resent.add(e.Position())
			span.SetStatus(codes.Error, validText(err.Error()))
			span.SetAttributes(semconv.ErrorTypeOther)
		case d.Skipped:
			span.SetAttributes(AttrSkipped.Bool(true))
		case d.DeadLetter != "":
			span.SetAttributes(AttrDeadLetter.String(d.DeadLetter), semconv.MessagingKafkaOffset(int(d.Offset)))
			span.SetStatus(codes.Error, "dead-lettered: "+d.DeadLetter)
		default:
			span.SetAttributes(semconv.MessagingKafkaOffset(int(d.Offset)))
		}
		span.End()
	}
}

// queue is the span processor between the SDK and its batch processor: it
// hands ended spans to a goroutine by a bounded channel and drops them
// when it is full, so that ending a span never waits for the exporter.
type queue struct {
	ch      chan sdktrace.ReadOnlySpan
	batch   sdktrace.SpanProcessor
	log     *slog.Logger
	dropped *atomic.Uint64
	once    *sync.Once
	mu      sync.RWMutex // held to send, and to close ch
	closed  bool
	drained chan struct{}
	pending atomic.Int64 // spans sent on ch and not yet given to batch
}

func newQueue(size int, exp *counting, log *slog.Logger) *queue {
	q := &queue{ch: make(chan sdktrace.ReadOnlySpan, size), log: log, dropped: &exp.dropped, once: &exp.once, drained: make(chan struct{})}
	exp.log = q.drop
	// The batch processor blocks the goroutine below, never the relay,
	// when its own queue is full.
	q.batch = sdktrace.NewBatchSpanProcessor(exp, sdktrace.WithBlocking())
	go func() {
		defer close(q.drained)
		for s := range q.ch {
			q.batch.OnEnd(s)
			q.pending.Add(-1)
		}
	}()
	return q
}

// drop counts n spans dropped, and logs the first time.
func (q *queue) drop(n int, why string, err error) {
	q.dropped.Add(uint64(n))
	q.once.Do(func() {
		q.log.Warn("trace spans dropped: "+why+"; events are not held for them, and walrelay_trace_spans_dropped_total counts them (this is logged once)", "err", err)
	})
}

func (q *queue) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (q *queue) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		return
	}
	q.pending.Add(1)
	select {
	case q.ch <- s:
	default:
		q.pending.Add(-1)
		q.drop(1, "the queue to the trace exporter is full (the collector is slow or down)", nil)
	}
}

func (q *queue) Shutdown(ctx context.Context) error {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.ch)
	}
	q.mu.Unlock()
	select {
	case <-q.drained:
	case <-ctx.Done():
		return ctx.Err()
	}
	return q.batch.Shutdown(ctx)
}

// ForceFlush gives the batch processor the spans queued, then flushes it.
func (q *queue) ForceFlush(ctx context.Context) error {
	for q.pending.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return q.batch.ForceFlush(ctx)
}

// counting is the exporter, counting the spans of an export that failed
// as dropped (and not reporting the error to the SDK, whose global handler
// would print each).
type counting struct {
	sdktrace.SpanExporter
	dropped atomic.Uint64
	once    sync.Once
	log     func(n int, why string, err error)
}

func (c *counting) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if err := c.SpanExporter.ExportSpans(ctx, spans); err != nil && !errors.Is(err, context.Canceled) {
		// A refused redirect alone: net/http quotes the URL redirected
		// to, query and all, before it.
		var refused *noredirect.Error
		if errors.As(err, &refused) {
			err = fmt.Errorf("%w: set OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) to the URL that answers itself", refused)
		}
		c.log(len(spans), "the trace exporter failed", err)
	}
	return nil
}
