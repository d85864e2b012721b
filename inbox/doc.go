// Package inbox is the consume side of the outbox pattern: a Kafka
// consumer that handles each event exactly once in its own database.
//
// For each record it claims the event id (the record's one "id" header:
// a record with none, an empty one or several is dead-lettered) of the
// record's topic for the consumer in the inbox table, and runs the
// handler in the same database transaction; it marks the Kafka offset only after that
// transaction committed. A record that Kafka delivers again (after a crash
// or a rebalance) or that a relay sent twice (the same id at another
// offset) finds its id claimed and is skipped, so the handler's changes in
// that transaction happen once. What the handler does outside the
// transaction (an HTTP call, an e-mail) is not covered: give such calls an
// idempotency key of their own, for example the event id.
//
// Records of one partition are handled in order, several to a transaction
// (a savepoint each, so one failure undoes only its own record); a
// failing record is retried with backoff and, after MaxAttempts, goes to
// a dead-letter topic, and its partition moves on while the others never
// wait for it. A stop or a rebalance waits for a handler ShutdownTimeout
// and a short grace at most. Rows older than Retention are deleted while
// the consumer runs. Package inbox knows nothing of the WAL.
//
// Values in a schema registry's format (walrelay's avro,
// registry_passthrough and registered_* formats: Confluent's wire format)
// carry their schema id (Message.SchemaID); a Registry decodes them, in
// Avro, Protobuf (after Confluent's message indexes) or JSON Schema, with
// the registry's schema of that id into the handler's type
// (Message.Decode with Config.Registry, or Registry.Decode) or gives
// their id, type and value (Message.Decoded, Registry.Decoded). A
// handler returning ErrUndecodable has its record dead-lettered at once;
// one returning ErrRegistryUnavailable has it retried without limit.
//
// With Config.VersionOrder, each aggregate's events (one topic and key) are
// handled in the order of their walrelay.aggregate_version header
// (outbox.version_column): the last version handled is kept in the
// versions table in the handler's transaction; a stale version is skipped
// and counted, and one ahead of the next waits up to VersionWait for the
// versions before it, then is dead-lettered (version_gap). The partition's
// offset is not committed past a record that waits.
package inbox
