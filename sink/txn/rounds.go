package txn

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/walrelay/walrelay/sink/produce"
)

// Rounds sends the rounds of exactly-once mode (a produce.Sender): one
// transactional client sends every record, in the open transaction,
// which Rounds has the Producer commit or abort at the rounds'
// boundaries: Rounds decides when, the Producer does the I/O. It is the
// flusher's alone.
type Rounds struct {
	p        *Producer
	q        *produce.Queue
	cur      *Current
	policy   Policy
	roundCap func(topic string) int32
	waiting  *atomic.Int64 // when the round in flight began (unix ns), 0 between rounds

	produced bool           // records handed to the client since its last flush
	handed   map[string]int // a topic's keyed records handed since the last flush (produce.WireSize)
}

// Rounds returns the Sender of exactly-once mode: p produces the rounds
// of its queue in its open transaction, which commits by its Config;
// roundCap is a topic's batch cap in a round; waiting is set to when each
// round began, and to 0 once it ended.
func (p *Producer) Rounds(roundCap func(topic string) int32, waiting *atomic.Int64) *Rounds {
	return &Rounds{p: p, q: p.q, cur: &p.cur, policy: p.cfg.policy(), roundCap: roundCap, waiting: waiting, handed: map[string]int{}}
}

// Until is when the open transaction must commit if nothing more arrives.
func (t *Rounds) Until() time.Time { return t.cur.CommitBy(t.policy) }

// Holds: the rounds' records are the open transaction's until it ends.
func (t *Rounds) Holds() bool { return true }

// BeginRound notes when the round began.
func (t *Rounds) BeginRound() { t.waiting.Store(time.Now().UnixNano()) }

// Send produces a record in the open transaction.
func (t *Rounds) Send(ctx context.Context, it produce.Item) error {
	if !it.Alone && it.R.Key != nil {
		// One transactional client, which partitions the records
		// itself. A topic's keyed records past one batch's worth wait
		// until what was handed is answered, so that no partition's
		// records are split over produce requests in flight together
		// (see produce.Lanes; by topic, as the partition is not known
		// yet: a round trip per batch of a topic, only for rounds past
		// that).
		w := produce.WireSize(it.R)
		if n := t.handed[it.R.Topic]; n > 0 && n+w > int(t.roundCap(it.R.Topic))-produce.BatchOverhead {
			t.p.flush(ctx)
			t.produced = false
			clear(t.handed)
			if broken := t.q.BrokenNow(); broken != nil {
				it.Done(it.R, broken)
				return broken
			}
		}
		t.handed[it.R.Topic] += w
	}
	if !it.Alone {
		t.p.produceInTxn(it)
		t.produced = true
		return nil
	}
	// What the round produced so far goes first, then this record in a
	// request of its own; a failure of either breaks the rest of the
	// round.
	if t.produced {
		t.p.flush(ctx)
		t.produced = false
		if broken := t.q.BrokenNow(); broken != nil {
			it.Done(it.R, broken)
			return broken
		}
	}
	t.p.produceInTxn(it)
	t.p.flush(ctx)
	return t.q.BrokenNow()
}

// Barrier flushes what was produced and commits the open transaction.
func (t *Rounds) Barrier(ctx context.Context) {
	if t.produced {
		t.p.flush(ctx)
		t.produced = false
	}
	t.p.endTxn(ctx, true)
}

// EndRound waits for the round's records to be answered, then aborts the
// open transaction if a record failed, or commits it if it is due or
// fills the buffers with the queue (nothing more can join it).
func (t *Rounds) EndRound(ctx context.Context) {
	if t.produced {
		// Returns once every record of the round is answered, or when
		// Close cancels ctx (the client then fails the rest).
		t.p.flush(ctx)
		t.produced = false
	}
	clear(t.handed)
	if t.q.BrokenNow() != nil {
		t.p.endTxn(ctx, false) // a record failed: abort at once
	} else if t.cur.CommitDue(time.Now(), t.q.Backlog(), t.policy) || t.q.WaitsOnHeld() {
		t.p.endTxn(ctx, true)
	}
	t.q.SetHeld(t.cur.Holds())
	t.waiting.Store(0)
}

// Closed aborts what the caller did not wait for.
func (t *Rounds) Closed() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.p.endTxn(ctx, false)
	cancel()
}
