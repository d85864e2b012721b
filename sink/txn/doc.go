// Package txn is walrelay's exactly-once producer: the Kafka transactions
// in which the sink produces a stream's records together with its source
// position.
//
// Invariants: records and their source position commit together, or
// neither does (a transaction's records and a record of the position of
// its last event, on the offsets topic); a fenced producer (one whose
// transactional id a newer producer took: not package produce's broker
// fence) never commits
// (the broker refuses it, and the caller, which holds the slot, has Resume
// renew it and read the committed position again before anything more is
// produced).
//
// What lives here: the transactional producer (Producer: its client,
// renewed after a fence, and its transactions: produce, flush, commit
// with the position, abort, and the answers held until the transaction
// ends); the position on the offsets topic (the marker that Resume
// commits, the read back from it with read_committed, the checks that no
// other slot or transactional id writes there); Resume, which initialises
// the producer, fences an earlier instance, reads the committed position
// and checks it against the database's WAL history, and the renewals
// after fences (mayRenew bounds those that nothing explains); the
// configuration (Config). And the decisions without I/O: the rounds of
// exactly-once mode (Rounds, the produce.Sender that has the Producer
// commit or abort at the rounds' boundaries); the flusher's view of the
// open transaction (Current): when it began, what it holds, the position
// of its last event, and when it is due to commit (Policy); and the
// poison records (Poisons): the events whose refusal doomed a
// transaction, dead-lettered when they are published again so that the
// next one commits. Current does no I/O and takes no lock: like etcd
// raft's state machine, it decides, and Rounds and the Producer, the only
// ones that touch it, begin, produce, commit and abort.
//
// Who calls it: package sink, the door, alone. It makes the Producer
// (New) with its queue and client options, pushes records to the queue,
// whose flusher (produce.Flush) drives Rounds; it asks AlreadyCommitted
// of each event published, notes and reads Poisons, and calls Resume at
// each replication session. This package never imports sink, never
// decides what an event's record is (package record), and never confirms
// a position to PostgreSQL: it reports what committed (Committed, and
// each event's answer once its transaction ends), and the caller's
// checkpoint decides.
package txn
