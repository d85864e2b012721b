// Package format writes outbox payloads in the value formats of a schema
// registry, as Debezium's converters write them, in Confluent's wire format
// (the magic byte 0, the schema's 4-byte id, the encoded value).
//
// It holds what those formats share with the JsonConverter's (package
// sink): a payload parsed as Jackson parses it, within Jackson's read
// limits (ParseJSON, ErrJSONLimit), and its Kafka
// Connect schema inferred as Debezium's EventRouter infers it with
// table.expand.json.payload=true (InferSchema). On that, Avro: the Connect
// schema translated as Apicurio's AvroConverter translates it (Avro), the
// value written in Avro's binary encoding straight from that schema and
// the parsed JSON as Avro's Java library writes it (EncodeAvro: linear in
// the payload, nothing kept per shape), the schema registered (or
// looked up) under the topic name strategy's subject, <topic>-key or
// <topic>-value, through the registry's client (package
// format/registry), its id cached (AvroEncoder).
//
// The schema-first formats (package format/schemafirst) and the
// inbox build on what format holds: the parsed JSON, its bounds, the Avro
// schema as walrelay reads it (ParseAvro, ParseAvroWrite) and decodes with
// (DecodeAvroWith). Passthrough checks values the application framed
// itself against the registry.
//
// A value that the format cannot write (registry.ErrPayload: a name Avro
// refuses, a number beyond a long) and a schema the registry refuses or
// does not have (registry.ErrRefused, registry.ErrNotRegistered) are
// errors of that event: the sink dead-letters it. Any other error of the
// registry is an outage (registry.Outage): the event is held and sent
// again. Package format/registry owns that vocabulary, the wire format
// (registry.Frame) and the HTTP client; format imports it, never the
// reverse.
package format
