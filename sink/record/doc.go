// Package record decides what one outbox event becomes as a Kafka record:
// its topic (the template or regex route of its table) and whether an
// event may go there (the allowed topics; walrelay's own and Kafka's
// internal topics never), its key, its headers (id, the optional
// walrelay headers, the configured columns, the CloudEvents binary-mode
// attributes), its timestamp when the event has a time of its own, and its
// key and value in the JSON formats of Kafka Connect's converters, with a
// JSON payload expanded as Debezium's EventRouter expands it.
//
// Invariant: a record is a pure function of the event and the
// configuration (Config). The package does no I/O, holds no Kafka client,
// starts no goroutine and reads no clock: the same event and configuration
// give the same record. A Builder caches only what changes no output (the
// texts of a transaction's headers, a regex route's topics), and is safe
// for concurrent use.
//
// Who calls it: package sink, the door through which the relay, the poll
// source, the inbox's dead letters and the recovery tools publish; and
// package config (through the exported checks: CheckRouting,
// CheckAllowedTopics, RouteConfined, ParseFormat, OptionalHeaders),
// relay's preflight and the poll source (CheckKeyColumn) to refuse at
// start what the sink would refuse.
//
// What it never does: talk to Kafka or a schema registry, so it writes no
// registry format (FormatAvro, the schema-first formats,
// FormatRegistryPassthrough: the sink writes those, before Encode, and
// Encode leaves them as they are); learn a topic's limits or partitions
// (the caller passes the cap an expanded value must fit); stamp a record
// with the clock (Record leaves a zero timestamp for an event without a
// time: the caller stamps it); decide a dead letter's reason, or whether
// an event is published at all. It returns errors; the sink decides what
// they mean to the pipeline. It imports nothing of the sink.
package record
