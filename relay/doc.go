// Package relay is walrelay's pipeline: it reads outbox changes from a
// logical replication slot (replication), turns them into events (decoder),
// tracks each transaction (checkpoint), publishes the events to Kafka (sink),
// and confirms to the slot only what Kafka acknowledged. relay.Run runs it,
// in the walrelay binary or embedded in a program of your own; it is the
// only package that knows all four.
//
// The loop (loop.go), on one goroutine: open a replication session, take
// its changes one by one (Next); a message is decoded; a Begin opens a
// transaction in the checkpoint, an event is counted in it and handed to the
// sink, a Commit closes it with its end LSN; a keepalive lets the checkpoint
// confirm the server's WAL end when nothing is in flight. The sink's
// callback acknowledges the event in the checkpoint; each time the
// checkpoint's confirmed LSN (the end of the longest fully acknowledged
// prefix of transactions) moves, it goes to the session (Confirm), whose
// status updates carry it. A failure ends the session and the loop opens the
// next.
//
// Invariants:
//   - PostgreSQL is never told a position whose events Kafka has not
//     acknowledged (or dead-lettered): the stream confirms only the
//     checkpoint's position (see package checkpoint).
//   - Restart: a publish that fails in a way that retrying may fix stops the
//     session (nothing more is produced once a failure is known); before the
//     next session streams, sink.Abort fails what the producer holds and
//     waits for what is in flight, and the server resends from the confirmed
//     position, so the failed event is sent again in order. A failure of an
//     earlier session does not restart the current one.
//   - A refusal that Kafka does not call retriable, of the same earliest
//     event with the same code in 5 sessions in a row, stops the relay (an
//     intermittent refusal fails at moving positions and does not add up).
//   - Drain: when ctx is cancelled the stream reads on to the end of the open
//     transaction (for up to ShutdownTimeout), waits for the events in flight
//     and sends a last status update; records are produced on a context that
//     outlives ctx by ShutdownTimeout. An error during the drain is returned.
//   - Order: a record acknowledged after an earlier record of its partition
//     failed in the same session would be written ahead of the resend; the
//     sink's rounds prevent it, and the relay checks it (Hooks.OrderBreak)
//     and logs it as an error.
//   - Start (preflight): the table has every column walrelay reads, none
//     generated; every walrelay_emit a writer may call is migrate's for
//     the configuration (CheckEmitFunction); with the message source on,
//     only the outbox's writers may emit messages
//     (CheckMessagePrivileges); the
//     publication publishes the outbox alone, via the partition root; a slot
//     walrelay created and that is gone is not created again. An UNLOGGED
//     partition, at start or attached later, stops the relay.
//
// Errors speak one vocabulary (package failure): the source, the decoder
// and the sink mark what they return as retriable (the session ends and the
// next resends from the confirmed position), per-event (the sink
// dead-letters the event; the relay sees an acknowledgement) or fatal (the
// relay stops and Run returns it). A change the pipeline cannot handle (a
// message that does not decode, a transaction out of order) is fatal.
//
// Observability attaches through Hooks and the Relay's accessors; the
// package serves no HTTP and imports no metrics library.
package relay
