package produce

import (
	"context"
	"time"
)

// A Sender sends the records of the rounds that Flush takes from the
// queue: at-least-once mode's lanes (one client per broker), or
// exactly-once mode's transactional client. Flush keeps the rounds'
// invariant (nothing is handed to a Sender after a record that breaks
// the queue, until an Abort barrier has passed); a Sender keeps its own
// (a partition's records in order, one batch per produce request; a
// transaction's records and its position together). Only Flush calls a
// Sender's methods, from one goroutine.
type Sender interface {
	// Until returns when the flusher stops waiting for a record with
	// nothing queued (an open transaction due to commit); zero: it waits.
	Until() time.Time
	// Holds reports whether a round's records count as held by the
	// Sender (an open transaction) until it says otherwise (SetHeld).
	Holds() bool
	// BeginRound is called as a round leaves the queue.
	BeginRound()
	// Send hands the Sender one record of the round, nothing breaking it
	// so far. It returns what breaks the rest of the round, if it learnt
	// of it (it then answers the record if it did not hand it on).
	Send(ctx context.Context, it Item) (broken error)
	// Barrier returns once every record handed before it is answered.
	Barrier(ctx context.Context)
	// EndRound is called after the round's last record.
	EndRound(ctx context.Context)
	// Closed is called once the queue is closed and empty, as Flush
	// returns.
	Closed()
}

// Flush runs rounds until q is closed and empty: it takes each round from
// q, lingering up to linger for more, and hands its records to snd, in
// order. A record behind one that breaks the round is answered with the
// error that broke it, unsent. At an Abort barrier it waits until snd has
// every earlier record answered, opens the queue's next generation, and
// lets Abort return.
func Flush(ctx context.Context, q *Queue, linger time.Duration, snd Sender) {
	var spare []Item
	for {
		round, broken, ok := q.Take(linger, spare, snd.Until(), snd.Holds())
		if !ok {
			snd.Closed()
			return
		}
		snd.BeginRound()
		for _, it := range round {
			switch {
			case it.Barrier != nil:
				// Everything queued before Abort is answered: produce
				// again, unless the sink closed meanwhile.
				snd.Barrier(ctx)
				broken = q.PassBarrier()
				close(it.Barrier)
			case broken != nil:
				it.Done(it.R, broken)
			default:
				broken = snd.Send(ctx, it)
			}
		}
		snd.EndRound(ctx)
		clear(round)
		spare = round[:0]
	}
}
