package checkpoint

import (
	"fmt"
	"sync"

	"github.com/jackc/pglogrepl"
)

// Txn is one transaction in the tracker's FIFO. Its methods are safe for
// concurrent use; Ack is typically called from the sink's producer callbacks
// while the receive goroutine calls Add and Commit.
type Txn struct {
	t         *Tracker
	commitLSN pglogrepl.LSN
	endLSN    pglogrepl.LSN
	pending   int
	committed bool
	failed    bool // an event could not be published: never confirmable
	dropped   bool
}

// Tracker computes the confirmed LSN from transactions and their acks. The
// zero value is not usable; call New.
type Tracker struct {
	mu        sync.Mutex
	fifo      []*Txn // in commit order; fifo[head:] are live
	head      int
	open      *Txn // the transaction whose Commit has not arrived yet
	confirmed pglogrepl.LSN
	inFlight  int
	onAdvance func(pglogrepl.LSN) // told each new confirmed LSN; set by Reset
}

// New returns a Tracker whose confirmed LSN starts at start, usually the
// slot's confirmed_flush_lsn.
func New(start pglogrepl.LSN) *Tracker {
	return &Tracker{confirmed: start}
}

// Begin opens a transaction whose commit record is at commitLSN (Begin's
// FinalLSN). A transaction still open from an earlier Begin is an error: the
// stream must have been restarted first with Reset.
func (t *Tracker) Begin(commitLSN pglogrepl.LSN) (*Txn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open != nil {
		return nil, fmt.Errorf("begin of transaction at %s while transaction at %s is still open", commitLSN, t.open.commitLSN)
	}
	x := &Txn{t: t, commitLSN: commitLSN}
	t.fifo = append(t.fifo, x)
	t.open = x
	return x, nil
}

// Add records one more event of x handed to the sink. Call it before the
// event is produced, so that its ack can never arrive first.
func (x *Txn) Add() {
	x.t.mu.Lock()
	x.pending++
	x.t.inFlight++
	x.t.mu.Unlock()
}

// Ack records that Kafka acknowledged one event of x (published or
// dead-lettered). It must be called exactly once per Add.
func (x *Txn) Ack() {
	t := x.t
	t.mu.Lock()
	x.pending--
	t.inFlight--
	if x.pending < 0 {
		t.mu.Unlock()
		panic("checkpoint: more acks than events in transaction at " + x.commitLSN.String())
	}
	t.advance()
	t.mu.Unlock()
}

// Fail records that one event of x will never be acknowledged (Kafka
// refused it). It counts as no longer in flight, and x can no longer be
// confirmed: only a Reset, after which the server resends x, moves the
// confirmed LSN past it. Call it at most once per Add, instead of Ack.
func (x *Txn) Fail() {
	t := x.t
	t.mu.Lock()
	x.pending--
	t.inFlight--
	x.failed = true
	t.mu.Unlock()
}

// Commit closes x with the end LSN of its commit record (Commit's
// TransactionEndLSN), the position that may be confirmed once all of its
// events are acknowledged.
func (x *Txn) Commit(endLSN pglogrepl.LSN) error {
	t := x.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open != x {
		return fmt.Errorf("commit at %s of a transaction that is not open", endLSN)
	}
	x.endLSN = endLSN
	x.committed = true
	t.open = nil
	t.advance()
	return nil
}

// CommitLSN returns the LSN of x's commit record, as given to Begin.
func (x *Txn) CommitLSN() pglogrepl.LSN { return x.commitLSN }

// Reset forgets every transaction not yet confirmed, when the stream
// restarts, and sets the confirmed LSN to from, where the new session
// starts; from then on onAdvance (if not nil) is told each LSN the confirmed
// one moves to. It is called with the tracker's lock held, so it must be
// quick and must not call the tracker: the session's Confirm. Setting it
// here, with the transactions dropped, keeps an ack of the old session from
// reaching the new one. The server resends everything after from, so those transactions
// come again, whole, and are tracked anew; acks of their events still in
// flight are harmless, and count in InFlight until they arrive. from is at
// or after the confirmed LSN on the same server; it is lower only when the
// server's WAL history changed (a restored or promoted server), whose slot,
// not this process, knows what was consumed there.
func (t *Tracker) Reset(from pglogrepl.LSN, onAdvance func(pglogrepl.LSN)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, x := range t.fifo[t.head:] {
		x.dropped = true
	}
	t.open = nil
	t.onAdvance = nil
	t.advance()
	t.confirmed = from
	t.onAdvance = onAdvance
}

// AdvanceIfIdle reports that the server's WAL end is walEnd (from a keepalive read
// after every earlier message was handed on). When nothing is in flight and
// no transaction is open, everything up to walEnd is consumed, and the
// confirmed LSN moves to it: without this an idle outbox on a busy database
// would hold WAL forever.
func (t *Tracker) AdvanceIfIdle(walEnd pglogrepl.LSN) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open == nil && t.inFlight == 0 && t.head == len(t.fifo) && walEnd > t.confirmed {
		t.confirmed = walEnd
		if t.onAdvance != nil {
			t.onAdvance(walEnd)
		}
	}
}

// Confirmed returns the highest LSN that is safe to confirm.
func (t *Tracker) Confirmed() pglogrepl.LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.confirmed
}

// InFlight returns the number of events handed to the sink and not yet
// acknowledged.
func (t *Tracker) InFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inFlight
}

// advance pops the fully acknowledged prefix and tells onAdvance where the
// confirmed LSN moved. t.mu must be held.
func (t *Tracker) advance() {
	was := t.confirmed
	defer func() {
		if t.confirmed > was && t.onAdvance != nil {
			t.onAdvance(t.confirmed)
		}
	}()
	for t.head < len(t.fifo) {
		x := t.fifo[t.head]
		// A dropped entry is skipped whatever its pending count: the server
		// resends its transaction, and the resent copy queued behind it
		// carries its own count.
		if !x.dropped {
			if !x.committed || x.pending > 0 || x.failed {
				return
			}
			if x.endLSN > t.confirmed {
				t.confirmed = x.endLSN
			}
		}
		t.fifo[t.head] = nil
		t.head++
	}
	// Reuse the backing array once it is drained, or compact when the dead
	// prefix dominates, so a long stream does not grow the slice.
	if t.head == len(t.fifo) {
		t.fifo = t.fifo[:0]
		t.head = 0
	} else if t.head > 1024 && t.head*2 > len(t.fifo) {
		n := copy(t.fifo, t.fifo[t.head:])
		clear(t.fifo[n:])
		t.fifo = t.fifo[:n]
		t.head = 0
	}
}
