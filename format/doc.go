// Package format writes outbox payloads in the value formats of a schema
// registry, as Debezium's converters write them, in Confluent's wire format
// (the magic byte 0, the schema's 4-byte id, the encoded value).
//
// It holds what those formats share with the JsonConverter's (package
// sink): a payload parsed as Jackson parses it (ParseJSON) and its Kafka
// Connect schema inferred as Debezium's EventRouter infers it with
// table.expand.json.payload=true (InferSchema). On that, Avro: the Connect
// schema translated as Apicurio's AvroConverter translates it (Avro), the
// value encoded with github.com/hamba/avro/v2, the schema registered (or
// looked up) under the topic name strategy's subject, <topic>-key or
// <topic>-value, through Confluent's Schema Registry API
// (github.com/twmb/franz-go/pkg/sr), its id cached (Registry,
// AvroEncoder).
//
// A value that the format cannot write (ErrPayload: a name Avro refuses, a
// number beyond a long) and a schema the registry refuses or does not have
// (ErrRefused, ErrNotRegistered) are errors of that event: the sink
// dead-letters it. Any other error of the registry is an outage: the event
// is held and sent again.
package format
