// Package replication owns walrelay's connection to PostgreSQL's WAL: the
// logical replication slot and the publication (create, inspect), the
// START_REPLICATION stream with pgoutput, keepalives, standby status updates,
// and reconnection with capped exponential backoff and jitter.
//
// It is the first stage of the data path, a pull source: Stream.Open starts
// a session (reconnecting with backoff while it cannot), Session.Next yields
// each XLogData payload and keepalive in WAL order, and Session.Confirm
// takes the positions that may be confirmed (the checkpoint's), which the
// status updates carry. It never talks to Kafka, and parses pgoutput in one
// place only: the framing of an XLogData over MaxMessageBytes.
//
// Invariants:
//   - The flush LSN sent to the server only ever comes from Confirm, never
//     from what was received, and never goes below the position the session
//     started from: the server does not guard against a confirmed position
//     moving backwards. A closed session ignores Confirm, so that an
//     acknowledgement of an earlier session cannot reach a later one.
//   - A session starts at the slot's confirmed_flush_lsn, or at the
//     position this process confirmed when that is further and the server's
//     system identifier, timeline and flushed WAL show it is the same WAL (a
//     server restart loses the slot's unsaved position; the process still
//     knows it).
//   - A status update goes out at least every StatusInterval, also while
//     the caller is busy between two Next calls (Kafka down), and with the
//     next Next after a keepalive that asks for one, so wal_sender_timeout
//     does not end the session.
//   - One writer at a time on the connection: the status goroutine, Next
//     and Close write under the session's mutex, and none writes once
//     pgconn has closed the connection after a failed read (it sends
//     Terminate from a goroutine of its own, through the same
//     pgproto3.Frontend, which is not safe for concurrent use); a clean
//     Close of a lost connection skips its last status update.
//   - A keepalive is yielded after every XLogData before it, so its WAL end
//     is safe to confirm when nothing is in flight.
//   - A session from which nothing arrives for ReceiveTimeout (time between
//     Next calls not counted) ends: a server cut off without a FIN must not
//     look like an idle one.
//   - A slot is created only by EnsureSlot, never by the stream; EnsureSlot
//     records each slot it creates in the publication's comment and does
//     not create a recorded slot again unless told to (a gone slot is a gap
//     in the stream: a new one starts at the end of the WAL).
//   - The publication must publish the outbox alone (CheckPublication),
//     via the partition root.
//   - No message of the server larger than MaxMessageBytes is held in
//     memory, whatever its length field says: a frame reader under
//     pgproto3's follows the framing without copying, reads an XLogData
//     over the limit as it arrives and drops it, keeping its head (the
//     values of an insert that fit, the start of a logical message's
//     content: Change.Kind TooLarge), and refuses any other message over it
//     (*ProtocolError). The stand-in it puts in the stream is a CopyData
//     type the server never sends, and nothing in the WAL can make it.
//   - A stream the session cannot read ends it with a *ProtocolError, a
//     server's error with a *pgconn.PgError, the server ending it (a
//     shutdown) with ErrServerEndedStream, a connection lost with the
//     connection's error: FuzzStream holds it to that, and to no panic.
//
// The session pins DateStyle=ISO, TimeZone=UTC, extra_float_digits=3,
// bytea_output=hex and IntervalStyle=postgres, so text values parse the same
// on every server. pgoutput runs with proto_version 1 and without streaming:
// transactions arrive only after they committed, whole and in commit order.
package replication
