// Package schemafirst writes outbox payloads in the schema that a schema
// registry already holds for the event: the application writes JSON, and
// the value is written in the schema of its subject (its type, its topic
// and type, or a configured subject and version: the subject strategies
// of package format/registry), in Confluent's wire format.
//
// One Encoder per format kind: Avro (KindAvro: the JSON read by the
// schema straight into Avro's binary encoding, hamba/avro), Protobuf
// (KindProtobuf: the registry's .proto compiled with
// github.com/bufbuild/protocompile, the JSON read by protojson into a
// dynamicpb message, Confluent's message indexes before it) or JSON Schema
// (KindJSONSchema: the JSON validated with
// github.com/santhosh-tekuri/jsonschema/v6, and written as it is). It also
// holds what the inbox needs of Protobuf and JSON Schema to read such
// values back within bounds (CompileProtobuf, CheckProtobuf,
// CompileJSONSchema).
//
// Its invariant: a schema is never inferred from a payload, and never
// registered but from the operator's schema files, when asked (Register,
// at start). A payload that does not fit its schema is ErrMismatch, a
// *MismatchError naming the field (a JSON pointer): the sink dead-letters
// it; an unusable schema is the registry's ErrNotRegistered; any other
// registry error is an outage (registry.Outage), the event held. Compiled
// schemas are cached within bounds (MaxCachedSchemaBytes of package
// format), read again after LatestTTL or a mismatch.
//
// Package sink, sink/record, inbox, config and cmd/walrelay call it. It
// imports format (the parsed JSON's bounds, Avro's schema reading) and
// format/registry; neither imports it. It never talks to Kafka nor logs.
package schemafirst
