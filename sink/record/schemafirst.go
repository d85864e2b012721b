package record

import "github.com/walrelay/walrelay/format/schemafirst"

// The schema-first value formats: the payload is JSON that the application
// wrote, written in the schema a schema registry holds for its event
// (the sink's Config.SchemaFirst, package format), in Confluent's wire
// format. A
// payload that does not fit the schema is dead-lettered (the sink's
// ReasonSchemaMismatch).
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

// FormatRegistryPassthrough is a value that the application already
// encoded and framed in Confluent's wire format (Debezium's Avro recipe: a
// bytea payload passed through by the ByteArrayConverter), published as it
// is once its framing is checked and its schema id found in the registry,
// a version of the value's subject (package format, Passthrough). Values
// only.
const FormatRegistryPassthrough Format = "registry_passthrough"

// SchemaFirst reports whether f is a schema-first format, and the kind
// of schema (schemafirst.KindAvro, …) it writes.
func (f Format) SchemaFirst() (kind string, ok bool) {
	switch f {
	case FormatRegisteredAvro:
		return schemafirst.KindAvro, true
	case FormatRegisteredProtobuf:
		return schemafirst.KindProtobuf, true
	case FormatRegisteredJSONSchema:
		return schemafirst.KindJSONSchema, true
	}
	return "", false
}

// Registry reports whether f is written through a schema registry: the
// sink writes it, not this package.
func (f Format) Registry() bool {
	_, ok := f.SchemaFirst()
	return ok || f == FormatAvro
}
