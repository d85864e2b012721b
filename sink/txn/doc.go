// Package txn is walrelay's exactly-once producer: the Kafka transactions
// in which the sink produces a stream's records together with its source
// position.
//
// Invariants: a transaction's records and the position of its last event
// commit together, or neither does; a producer that the broker fenced
// never commits again (the sink renews it, and reads the committed
// position again, before anything more is produced).
//
// What lives here so far: the rounds of exactly-once mode (Rounds, the
// produce.Sender that commits or aborts at the rounds' boundaries through
// a Producer); the flusher's view of the open transaction (Current): when
// it began, what it holds, the position of its last event, and when it is
// due to commit (Policy); and the poison records
// (Poisons): the events whose refusal doomed a transaction, dead-lettered
// when they are published again so that the next one commits. Current
// does no I/O and takes no lock: like etcd raft's state machine, it
// decides, and the caller (Rounds and package sink's Producer, the only
// ones that touch it) begins, produces, commits and aborts. The
// transactional client, the position in the offsets topic, resume and the
// renewals after fences are still package sink's (txn.go, offsets.go,
// resume.go), which imports this package; this package imports produce
// (whose Sender it implements) and never sink.
package txn
