package sink

import (
	"context"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/format"
)

// The schema-first value formats: the payload is JSON that the application
// wrote, written in the schema a schema registry holds for its event
// (Config.SchemaFirst, package format), in Confluent's wire format. A
// payload that does not fit the schema is dead-lettered
// (ReasonSchemaMismatch).
const (
	// FormatRegisteredAvro is Avro in the subject's registered schema.
	FormatRegisteredAvro Format = "registered_avro"
	// FormatRegisteredProtobuf is Protobuf in the subject's registered
	// schema, after Confluent's message indexes.
	FormatRegisteredProtobuf Format = "registered_protobuf"
	// FormatRegisteredJSONSchema is the JSON itself, valid in the
	// subject's registered JSON Schema.
	FormatRegisteredJSONSchema Format = "registered_jsonschema"
)

// ReasonSchemaMismatch is the dead-letter reason of a payload that does
// not fit its registered schema (format.ErrMismatch); the error header
// names the subject, its version, the field (a JSON pointer) and why.
const ReasonSchemaMismatch = "schema_mismatch"

// SchemaFirst reports whether f is a schema-first format, and the kind
// of schema (format.KindAvro, …) it writes.
func (f Format) SchemaFirst() (kind string, ok bool) {
	switch f {
	case FormatRegisteredAvro:
		return format.KindAvro, true
	case FormatRegisteredProtobuf:
		return format.KindProtobuf, true
	case FormatRegisteredJSONSchema:
		return format.KindJSONSchema, true
	}
	return "", false
}

// registry reports whether f is written through a schema registry.
func (f Format) registry() bool {
	_, ok := f.SchemaFirst()
	return ok || f == FormatAvro
}

// schemaFirstValue writes e's payload, the value of r to topic, in its
// registered schema.
func (s *Sink) schemaFirstValue(ctx context.Context, e *event.Event, topic string) ([]byte, error) {
	// A value over the topic's batch cap is refused as it is written
	// (too_large): the client would refuse the record anyway.
	return s.cfg.SchemaFirst.Value(ctx, topic, e.Type, e.Payload, int(s.batchCapOf(topic)))
}
