// Package registry is walrelay's client of a schema registry through
// Confluent's Schema Registry API (Apicurio serves it at
// /apis/ccompat/v7), over github.com/twmb/franz-go/pkg/sr, and the
// vocabulary of its errors that every registry format shares.
//
// It owns Confluent's wire format (Frame, Unframe: the magic byte 0 and
// the schema's 4-byte id before the value), the topic name strategy's
// subjects (Subject) and the check of a subject made of an event's type
// (TypeSubject); the Client, which registers or looks up a schema's id
// once per subject and caches it (ID), reads a schema by id or version
// and its references within bounds (SchemaByID, InSubject, References),
// and reports each request's outcome (OnRequest) through an HTTP
// transport that follows no redirect and bounds each answer.
//
// Its invariant is the meaning of an error to the pipeline: a schema the
// registry refuses or lacks, or a value that cannot be written
// (ErrRefused, ErrNotRegistered, ErrSchemaUnknown, ErrPayload,
// ErrInvalid) is that event's error, which the sink dead-letters;
// ErrUnauthorized stops walrelay; anything else is an outage (Outage):
// the event is held and sent again. A refusal is remembered for
// Config.UnusableReadInterval, so that a writer's rows of a refused
// shape cost a request once per interval; an outage is never remembered.
// No error prints the URL's credentials.
//
// Package format and its encoders (Avro inference, schema-first,
// passthrough), sink, inbox, config and cmd/walrelay call it. It never
// encodes or decodes a value, infers or compiles a schema, nor logs.
package registry
