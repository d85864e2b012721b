package sink

import (
	"context"
	"time"

	"github.com/walrelay/walrelay/sink/produce"
)

// flush runs rounds until the queue is closed and empty. In exactly-once
// mode it also opens and ends the Kafka transactions (txn.go).
func (s *Sink) flush(ctx context.Context) {
	defer close(s.flushed)
	var spare []produce.Item
	leaders := map[topicPartition]int32{} // the lanes' leaders, learnt once a round
	handed := map[string]int{}            // exactly-once mode: a topic's keyed records handed since the last flush (produce.WireSize)
	hand := func(it produce.Item) {
		switch {
		case s.tx != nil:
			s.produceInTxn(it)
		case s.lanes != nil:
			s.lanes.send(ctx, it, leaders)
		default:
			s.client().Produce(it.Ctx, it.R, it.Done)
		}
	}
	// flushAll returns once every record produced is answered.
	flushAll := func() {
		if s.lanes != nil {
			s.lanes.drain(ctx)
		} else {
			_ = s.client().Flush(ctx)
		}
	}
	for {
		var until time.Time
		if s.tx != nil {
			until = s.tx.commitBy()
		}
		round, broken, ok := s.q.Take(s.cfg.Linger, spare, until, s.tx != nil)
		if !ok {
			if s.tx != nil {
				// Closed: what the caller did not wait for is aborted.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				s.endTxn(ctx, false)
				cancel()
			}
			return
		}
		clear(leaders)
		if s.lanes == nil {
			s.waiting.Store(time.Now().UnixNano())
		}
		produced := false
		clear(handed)
		for _, it := range round {
			if s.tx != nil && it.Barrier == nil && broken == nil && !it.Alone && it.R.Key != nil {
				// Exactly-once mode: one transactional client, which
				// partitions the records itself. A topic's keyed records
				// past one batch's worth wait until what was handed is
				// answered, so that no partition's records are split
				// over produce requests in flight together (see lanes.run;
				// by topic, as the partition is not known yet: a round
				// trip per batch of a topic, only for rounds past that).
				w := produce.WireSize(it.R)
				if n := handed[it.R.Topic]; n > 0 && n+w > int(s.roundCapOf(it.R.Topic))-produce.BatchOverhead {
					_ = s.client().Flush(ctx)
					produced = false
					clear(handed)
					if broken = s.q.BrokenNow(); broken != nil {
						it.Done(it.R, broken)
						continue
					}
				}
				handed[it.R.Topic] += w
			}
			switch {
			case it.Barrier != nil:
				// Everything queued before Abort is answered (and, in
				// exactly-once mode, the open transaction ended): produce
				// again, unless the sink closed meanwhile.
				if produced || s.lanes != nil { // lanes hold earlier rounds' records too
					flushAll()
					produced = false
				}
				if s.tx != nil {
					s.endTxn(ctx, true)
				}
				if s.lanes != nil {
					s.lanes.forget()
				}
				broken = s.q.PassBarrier()
				close(it.Barrier)
			case broken != nil:
				it.Done(it.R, broken)
			case it.Alone && s.lanes != nil:
				hand(it) // its lane sends it alone
			case it.Alone:
				// What the round produced so far goes first, then this
				// record in a request of its own; a failure of either
				// breaks the rest of the round.
				if produced {
					_ = s.client().Flush(ctx)
					produced = false
					if broken = s.q.BrokenNow(); broken != nil {
						it.Done(it.R, broken)
						continue
					}
				}
				hand(it)
				_ = s.client().Flush(ctx)
				broken = s.q.BrokenNow()
			default:
				hand(it)
				produced = true
			}
		}
		if s.lanes != nil {
			s.lanes.release()
		}
		if produced && s.lanes == nil {
			// Returns once every record of the round is answered, or
			// when Close cancels ctx (the client then fails the rest).
			_ = s.client().Flush(ctx)
		}
		if s.tx != nil {
			if s.q.BrokenNow() != nil {
				s.endTxn(ctx, false) // a record failed: abort at once
			} else if s.tx.commitDue(time.Now(), s.q.Backlog()) || s.q.WaitsOnHeld() {
				// Due, or the transaction and the queue fill the
				// buffers: nothing more can join it.
				s.endTxn(ctx, true)
			}
			s.q.SetHeld(s.tx.holds())
		}
		s.waiting.Store(0)
		clear(round)
		spare = round[:0]
	}
}
