// Package decoder turns pgoutput messages into outbox events.
//
// It sits between replication, which hands it each XLogData payload with its
// WAL position, and the sink, which publishes the events it yields. It is a
// pure function of the bytes and its relation cache: no I/O, no goroutines,
// no clock. One call decodes one message and yields one Message (a Begin, an
// EventMessage carrying an event.Event, a Commit, or an Ignored change), so a
// transaction of any size streams through without being held in memory.
//
// Inserts into the configured outbox tables become Events, each table's
// columns found by the names of its Layout. An outbox table is known by its
// OID (Layout.RelationID: it follows a rename, and a partitioned outbox
// published via its root) or by its name; its events carry that name as
// their Source. With Config.Messages, logical decoding messages with the
// configured prefix (pg_logical_emit_message(true, 'walrelay', '{…}'))
// become Events too: an outbox without a table. Updates, deletes,
// truncates, heartbeats and every other message (under another prefix,
// which any role can emit, or under the prefix with Messages off) are
// Ignored and named, so they can be counted; none stops the stream.
//
// A row that breaks a rule of its own (a required column NULL, a value that
// does not parse) still yields an Event, with Invalid set: the sink sends it
// to the dead-letter topic, and the stream goes on. A message that breaks the
// stream (malformed bytes, an insert for an unknown relation, an outbox table
// without a required column, a row of a table that is not the outbox, which
// may be a partition published under its own name) is returned as an *Error, and the pipeline stops:
// skipping it could lose events.
//
// A message too large to hold (over postgres.max_message_bytes) reaches
// the decoder cut down by the replication stream: DecodeTooLarge makes the
// event of an outbox insert or a message under the read prefix from what
// was kept, Invalid with event.ErrTooLarge and without its payload, so that
// it is dead-lettered as too_large; another message over the limit is an
// *Error that names the setting.
//
// pglogrepl.Parse panics on some malformed input; Decode recovers at exactly
// that boundary and returns an *Error. The fuzz target FuzzDecode holds it to
// that.
package decoder
