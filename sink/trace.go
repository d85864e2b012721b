package sink

import (
	"slices"

	"github.com/walrelay/walrelay/event"
)

// HeaderTraceparent and HeaderTracestate are the W3C trace context headers
// an event carries when its row had a trace context (outbox.trace_column).
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// Tracer records spans for the events that carry a trace context. Package
// tracing implements it with the OpenTelemetry SDK.
type Tracer interface {
	// Publish is called once per publish of an event whose traceparent
	// header is traceparent (tracestate is its tracestate header, or nil).
	// It returns the traceparent the record carries instead (the span of
	// the publish, which the consumer continues) and the function the sink
	// calls with the event's fate, or a nil end to leave the event as is.
	// It is also called for an event without a traceparent header, with
	// traceparent nil: a Tracer that starts a new trace returns its
	// traceparent, which the record then carries.
	Publish(e *event.Event, traceparent, tracestate []byte) (carry []byte, end func(d Delivery, err error))
}

// traced asks the Tracer for the spans of e (with or without a trace
// context: the Tracer decides whether to start a trace): it
// returns a copy of e whose traceparent header is the publish span's, and
// done wrapped to end the span. e itself is left as it is: the relay may
// publish it again after a failure, which is a publish of its own.
func (s *Sink) traced(e *event.Event, done Done) (*event.Event, Done) {
	var parent, state []byte
	for _, h := range e.Headers {
		switch h.Key {
		case HeaderTraceparent:
			parent = h.Value
		case HeaderTracestate:
			state = h.Value
		}
	}
	carry, end := s.cfg.Tracer.Publish(e, parent, state)
	if end == nil {
		return e, done
	}
	c := *e
	if parent == nil {
		// A new trace: the record carries its root span.
		c.Headers = append(slices.Clip(e.Headers), event.Header{Key: HeaderTraceparent, Value: carry})
	} else {
		c.Headers = slices.Clone(e.Headers)
		for i := range c.Headers {
			if c.Headers[i].Key == HeaderTraceparent {
				c.Headers[i].Value = carry
			}
		}
	}
	return &c, func(d Delivery, err error) {
		end(d, err)
		done(d, err)
	}
}
