// Package tracing records walrelay's OpenTelemetry spans: for each event
// whose row carried the writer's trace context (outbox.trace_column), a
// span for the time the event waited in the WAL (from its commit to
// walrelay reading it) and a span for its publish (until Kafka acknowledged
// it, or it was dead-lettered), both children of the writer's span. The
// record's traceparent header then carries the publish span, so that the
// consumer's span (package inbox) continues it.
//
// New sets up the OpenTelemetry SDK from the standard OTEL_* environment
// variables (the OTLP exporter's endpoint, protocol and headers, the
// service name, defaulting to walrelay, and the sampler, parent-based by
// default so that the writer's sampling decision holds). It refuses to
// start on an OTLP header, endpoint or sampler setting it cannot read,
// naming the variable but never its value, and routes OpenTelemetry's own
// logger and error handler to its slog logger without the values they
// name. Attribute values are bounded (256 bytes by default) and a key that
// is not UTF-8 is left out, so that one row never fails an OTLP batch.
// Spans go through
// a bounded queue that never blocks the relay: when the collector is slow
// or down, spans are dropped and counted (Dropped) and one line is logged.
package tracing
