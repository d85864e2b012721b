package sink

import (
	"context"
	"time"

	"github.com/walrelay/walrelay/sink/txn"
)

// Hooks for the tests of exactly-once mode that drive the whole Sink and
// look at its transactional producer (package txn) as well.

// maxUnexplained is txn.MaxUnexplained, the renewals that a test of
// unexplained fences counts against.
const maxUnexplained = txn.MaxUnexplained

// txnCounts returns what the sink's transactional producer did so far
// (txn.Producer.Counts).
func (s *Sink) txnCounts() txn.Counts { return s.tx.Counts() }

// txnBegan returns when the open (or last) transaction began; call it
// from Transactions.OnCommit (txn.Producer.Began).
func (s *Sink) txnBegan() time.Time { return s.tx.Began() }

// readCommitted reads the committed position again, as Resume does
// (txn.Producer.ReadCommitted).
func (s *Sink) readCommitted(ctx context.Context) error { return s.tx.ReadCommitted(ctx) }
