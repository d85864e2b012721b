package sink

import (
	"context"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/sink/txn"
)

// Exactly-once production (Config.Transactions) is package txn's: the
// transactional producer, its transactions and their position on the
// offsets topic, Resume and the renewals after fences. These are its
// door.

// Transactions configures exactly-once production (txn.Config).
type Transactions = txn.Config

// The errors with which exactly-once production stops a relay (package
// txn says when).
var (
	ErrFenced                = txn.ErrFenced
	ErrTransactionTimedOut   = txn.ErrTransactionTimedOut
	ErrWALHistory            = txn.ErrWALHistory
	ErrOtherTransactionalID  = txn.ErrOtherTransactionalID
	ErrSharedTransactionalID = txn.ErrSharedTransactionalID
	ErrFencedTooOften        = txn.ErrFencedTooOften
	ErrOffsetsTopicNotReady  = txn.ErrOffsetsTopicNotReady
)

// Committed returns the position up to which every event is in Kafka, in
// exactly-once mode (the zero position before any).
func (s *Sink) Committed() event.Position {
	if s.tx == nil {
		return event.Position{}
	}
	return s.tx.Committed()
}

// Transactional reports whether the sink produces in transactions.
func (s *Sink) Transactional() bool { return s.tx != nil }

// Resume is called at the start of every replication session, once the
// session holds the slot, before anything of it is published. In
// exactly-once mode the first call initialises the transactional producer
// (fencing an earlier instance of the transactional id) and reads the
// committed position; later calls end the open transaction as Abort does,
// and renew the producer after a fence (txn.Producer.Resume). h is the
// database's WAL history: a committed position that is not on it is
// refused (ErrWALHistory). In at-least-once mode it does nothing. Resume
// must not run concurrently with Publish (the relay publishes on the
// goroutine that calls Resume).
func (s *Sink) Resume(ctx context.Context, h event.WALHistory) error {
	if s.tx == nil {
		return nil
	}
	return s.tx.Resume(ctx, h, s.Abort)
}

// CheckTransactions reports whether the brokers give what exactly-once
// mode needs (txn.Check): transactions, the right to use transactionalID
// where the brokers can tell, and an offsets topic of the right shape if
// it exists. It changes nothing: it fences nobody.
func (s *Sink) CheckTransactions(ctx context.Context, offsetsTopic, transactionalID string) (string, error) {
	return txn.Check(ctx, s.client(), s.log, offsetsTopic, transactionalID)
}
