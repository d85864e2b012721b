// Package checkpoint owns the one position walrelay confirms to PostgreSQL.
//
// It sits at the end of the data path: replication hands WAL to the decoder,
// the decoder yields begin, event and commit messages, the sink produces each
// event to Kafka and reports its acknowledgement here, and replication asks
// this package which LSN it may send in its next standby status update.
//
// A Tracker keeps a FIFO of transactions in commit order. Each entry counts
// the events that were handed to the sink and not yet acknowledged, and gets
// its end LSN (the Commit message's TransactionEndLSN) once the commit
// arrives. The confirmed LSN is the end LSN of the longest prefix of entries
// that are committed and fully acknowledged.
//
// Invariant: PostgreSQL is never told a flush LSN whose events Kafka has not
// acknowledged. Confirming late only replays events (consumers deduplicate on
// the event id); confirming early loses them, so every doubt resolves towards
// the lower LSN. The confirmed LSN never moves backwards on one server's WAL
// history (Reset may set it back only for a restored or promoted server).
//
// The package does no I/O and never blocks the data path: every method takes
// one short mutex and returns.
package checkpoint
