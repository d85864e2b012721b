package sink

import (
	"context"
	"time"

	"github.com/walrelay/walrelay/sink/produce"
)

// txnRounds sends the rounds of exactly-once mode (a produce.Sender): one
// transactional client, the producer, sends every record, in the open
// Kafka transaction (txn.go), which it opens, commits and aborts at the
// rounds' boundaries.
type txnRounds struct {
	s        *Sink
	produced bool           // records handed to the client since its last flush
	handed   map[string]int // a topic's keyed records handed since the last flush (produce.WireSize)
}

func (t *txnRounds) Until() time.Time { return t.s.tx.cur.CommitBy(t.s.tx.cfg.policy()) }

func (t *txnRounds) Holds() bool { return true }

func (t *txnRounds) BeginRound() { t.s.waiting.Store(time.Now().UnixNano()) }

func (t *txnRounds) Send(ctx context.Context, it produce.Item) error {
	s := t.s
	if !it.Alone && it.R.Key != nil {
		// One transactional client, which partitions the records
		// itself. A topic's keyed records past one batch's worth wait
		// until what was handed is answered, so that no partition's
		// records are split over produce requests in flight together
		// (see produce.Lanes; by topic, as the partition is not known yet:
		// a round trip per batch of a topic, only for rounds past that).
		w := produce.WireSize(it.R)
		if n := t.handed[it.R.Topic]; n > 0 && n+w > int(s.roundCapOf(it.R.Topic))-produce.BatchOverhead {
			_ = s.client().Flush(ctx)
			t.produced = false
			clear(t.handed)
			if broken := s.q.BrokenNow(); broken != nil {
				it.Done(it.R, broken)
				return broken
			}
		}
		t.handed[it.R.Topic] += w
	}
	if !it.Alone {
		s.produceInTxn(it)
		t.produced = true
		return nil
	}
	// What the round produced so far goes first, then this record in a
	// request of its own; a failure of either breaks the rest of the
	// round.
	if t.produced {
		_ = s.client().Flush(ctx)
		t.produced = false
		if broken := s.q.BrokenNow(); broken != nil {
			it.Done(it.R, broken)
			return broken
		}
	}
	s.produceInTxn(it)
	_ = s.client().Flush(ctx)
	return s.q.BrokenNow()
}

// Barrier flushes what was produced and commits the open transaction.
func (t *txnRounds) Barrier(ctx context.Context) {
	if t.produced {
		_ = t.s.client().Flush(ctx)
		t.produced = false
	}
	t.s.endTxn(ctx, true)
}

// EndRound waits for the round's records to be answered, then aborts the
// open transaction if a record failed, or commits it if it is due or
// fills the buffers with the queue (nothing more can join it).
func (t *txnRounds) EndRound(ctx context.Context) {
	s := t.s
	if t.produced {
		// Returns once every record of the round is answered, or when
		// Close cancels ctx (the client then fails the rest).
		_ = s.client().Flush(ctx)
		t.produced = false
	}
	clear(t.handed)
	if s.q.BrokenNow() != nil {
		s.endTxn(ctx, false) // a record failed: abort at once
	} else if s.tx.cur.CommitDue(time.Now(), s.q.Backlog(), s.tx.cfg.policy()) || s.q.WaitsOnHeld() {
		s.endTxn(ctx, true)
	}
	s.q.SetHeld(s.tx.cur.Holds())
	s.waiting.Store(0)
}

// Closed aborts what the caller did not wait for.
func (t *txnRounds) Closed() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.s.endTxn(ctx, false)
	cancel()
}
