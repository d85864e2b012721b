// Package outbox is the write side of the transactional outbox: it inserts
// an event into the outbox table inside the caller's database transaction,
// so that the event is committed if and only if the business change is.
// walrelay then publishes it from the WAL.
//
// The table layout is walrelay's (decoder.Config: the one definition of it,
// shared with `walrelay run` and `walrelay migrate`): configure the same
// names here as there. Event ids are UUIDv7 (time-ordered) generated in the
// caller's process, unless the caller gives one: a retried business
// operation reuses its id, and consumers (package inbox) deduplicate on it.
//
// Write and WriteBatch take a pgx.Tx; WriteSQL takes a *sql.Tx. Package
// outbox never talks to Kafka.
package outbox
