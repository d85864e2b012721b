package sink

import (
	"context"

	"github.com/walrelay/walrelay/event"
)

// ReasonSchemaMismatch is the dead-letter reason of a payload that does
// not fit its registered schema (schemafirst.ErrMismatch) in a schema-first
// format (record.FormatRegisteredAvro, …); the error header names the
// subject, its version, the field (a JSON pointer) and why.
const ReasonSchemaMismatch = "schema_mismatch"

// schemaFirstValue writes e's payload, the value of r to topic, in its
// registered schema.
func (s *Sink) schemaFirstValue(ctx context.Context, e *event.Event, topic string) ([]byte, error) {
	// A value over the topic's batch cap is refused as it is written
	// (too_large): the client would refuse the record anyway.
	return s.cfg.SchemaFirst.Value(ctx, topic, e.Type, e.Payload, int(s.batchCapOf(topic)))
}
