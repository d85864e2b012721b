package inbox

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/walrelay/walrelay/internal/textcut"
)

// scopeName is the instrumentation scope of the inbox's spans.
const scopeName = "github.com/walrelay/walrelay/inbox"

// Attributes of the inbox's process spans besides the messaging ones.
const (
	attrDuplicate  = attribute.Key("walrelay.inbox.duplicate")
	attrAttempt    = attribute.Key("walrelay.inbox.attempt")
	attrDeadLetter = attribute.Key("walrelay.dead_letter.reason")
)

// headerCarrier reads a record's headers as a propagation.TextMapCarrier.
type headerCarrier []kgo.RecordHeader

func (h headerCarrier) Get(key string) string {
	for _, x := range h {
		if x.Key == key {
			return string(x.Value)
		}
	}
	return ""
}

func (headerCarrier) Set(string, string) {}

func (h headerCarrier) Keys() []string {
	keys := make([]string, len(h))
	for i, x := range h {
		keys[i] = x.Key
	}
	return keys
}

// startSpan starts the process span of r (whose event id is id, "" if
// unreadable) in ctx, a child of the span context its traceparent header
// names: each record is processed by a handler call of its own, for which
// OpenTelemetry's messaging conventions allow the producer's context as
// the parent, and a child keeps the writer's, walrelay's and the
// consumer's spans in one trace that a trace viewer shows as one tree (a
// link is what the conventions recommend for a batch processed as one).
// Without a TracerProvider it returns ctx and nil, allocating nothing.
func (c *Consumer) startSpan(ctx context.Context, r *kgo.Record, id string) (context.Context, trace.Span) {
	if c.tracer == nil {
		return ctx, nil
	}
	pctx := propagation.TraceContext{}.Extract(ctx, headerCarrier(r.Headers))
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKafka, semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(r.Topic), semconv.MessagingDestinationPartitionID(strconv.Itoa(int(r.Partition))),
		semconv.MessagingKafkaOffset(int(r.Offset)), semconv.MessagingConsumerGroupName(c.cfg.Group),
	}
	if v, ok := textAttr([]byte(id)); ok {
		attrs = append(attrs, semconv.MessagingMessageID(v))
	}
	if v, ok := textAttr(r.Key); ok {
		attrs = append(attrs, semconv.MessagingKafkaMessageKey(v))
	}
	return c.tracer.Start(pctx, "process "+r.Topic, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}

// maxAttrLen bounds the length of the key and id attributes: the user's
// TracerProvider may set no limit, and a key may be large.
const maxAttrLen = 256

// textAttr is b as a span attribute value: cut to maxAttrLen bytes on a
// character boundary, and not at all (false) when b is empty or not UTF-8
// (an Avro or other binary key): protobuf refuses a string that is not,
// and the OTLP exporter then fails the whole batch holding the span.
func textAttr(b []byte) (string, bool) {
	if len(b) == 0 || !utf8.Valid(b) {
		return "", false
	}
	return textcut.Prefix(string(b), maxAttrLen), true
}

// validErr is err, or when its text is not UTF-8 (a handler's error
// quoting a binary key) an error of its text made valid (U+FFFD): a span's
// status and exception event are protobuf strings.
func validErr(err error) error {
	if msg := err.Error(); !utf8.ValidString(msg) {
		return errors.New(strings.ToValidUTF8(msg, "\uFFFD"))
	}
	return err
}

// openSpan is the process span of the batch's record at index i.
type openSpan struct {
	span trace.Span
	i    int
}

// endSpans ends the process spans of a batch: those before done committed
// (OK), the one at failed (if >= 0) failed with failure, and the others
// with the transaction, which did not commit (txErr).
func endSpans(spans []openSpan, done, failed int, failure, txErr error) {
	for _, s := range spans {
		switch {
		case s.i < done && txErr == nil:
		case s.i == failed && failure != nil:
			failure := validErr(failure)
			s.span.RecordError(failure)
			s.span.SetStatus(codes.Error, failure.Error())
		default:
			msg := "the transaction did not commit"
			if txErr != nil {
				msg += ": " + validErr(txErr).Error()
			}
			s.span.SetStatus(codes.Error, msg)
		}
		s.span.End()
	}
}
