package sink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/sink/produce"
)

// The sink hands records to the client in rounds, so that no record can be
// written ahead of an earlier one of its partition that failed.
//
// When a produce request fails for good, the client fails every record it
// holds for that partition, but walrelay learns of it only when the failed
// record's callback runs, later, on another goroutine. A record produced in
// between would start a new batch and could be written before the failed
// record is sent again. So the client flushes manually and never sends on its
// own: the flusher takes every record queued so far (a round), hands all of
// them to the client, and flushes; Flush returns once every record of the
// round has been answered and its callback has run. Records published
// meanwhile wait in the queue. If a record of the round failed in a way that
// fails later ones (anything but a failure of that record alone, which is
// dead-lettered), the sink is broken: every queued record is failed with
// ErrNotSent, unsent, until Abort. The caller restarts from the failed record.
//
// Rounds cost little against one broker: the client keeps one produce
// request in flight per broker anyway, and while it is in flight the next
// round gathers in the queue, as it would have in the client's buffer. What
// they add is the time the round's callbacks take before the next round
// goes and, with several brokers, a wait for the slowest of them, which the
// lanes of at-least-once mode avoid (lanes.go): there the flusher hands each
// round to the brokers' lanes without waiting, and each lane runs rounds of
// its own as described here.

// ErrNotSent fails a record that was not sent because an earlier record
// failed, or because the sink was aborted or closed.
var ErrNotSent = errors.New("not sent")

// errStale fails a record pushed for an event published before the last
// Abort (queue.gen); it breaks nothing: the session that published the
// event is over, and the event is published again.
var errStale = fmt.Errorf("%w: its event was published before an abort, and is published again after it", ErrNotSent)

// queued is a record waiting for its round, or an Abort barrier (r nil).
type queued struct {
	ctx     context.Context
	r       *kgo.Record
	done    func(*kgo.Record, error)
	alone   bool // sent in a request of its own
	size    int  // produce.RecordSize(r)
	barrier chan struct{}
	// pos is the position of the record's event, for the position record
	// of an exactly-once transaction; hasPos is false for records of none.
	pos    event.Position
	hasPos bool
}

// queue holds the records of the next round.
type queue struct {
	mu      sync.Mutex
	items   []queued
	bytes   int
	firstAt time.Time     // when the first queued record arrived
	space   chan struct{} // closed, and replaced, when a round leaves the queue
	work    chan struct{} // the queue needs the flusher's attention
	broken  error         // set by a failure that fails later records; cleared by Abort
	// isBroken is broken != nil, read without mu: a lane looks at it
	// before it hands each record to its client (lanes.go).
	isBroken atomic.Bool
	closed   bool
	// gen counts the Abort barriers the flusher has passed. A record
	// pushed on behalf of an event published before the last barrier (a
	// dead letter produced from a callback, after its event failed)
	// carries the generation of its event and is refused: the caller
	// resends that event after the barrier, and a record of it produced
	// now could join, as its last record, a transaction whose position
	// would then cover events still to be resent.
	gen      uint64
	maxRecs  int
	maxBytes int
	flushAt  int // bytes at which the flusher stops lingering
	// held and heldBytes are the records of the open Kafka transaction
	// (exactly-once mode), in flight or acknowledged and not yet answered,
	// each with its event, until the transaction ends: they count against
	// the buffers with the queued ones, so that the records published and
	// not yet answered stay within MaxBufferedRecords and
	// MaxBufferedBytes. A round adds its records as it leaves the queue;
	// the flusher sets the transaction's count after each round (setHeld),
	// and 0 when it ends.
	held, heldBytes int
	// heldFull: a push waits for room that only the end of the open
	// transaction frees (the transaction and the queue fill the
	// buffers): nothing more can join it, so the flusher takes what is
	// queued at once and commits (flush). Cleared by setHeld.
	heldFull bool
}

func newQueue(cfg Config) *queue {
	return &queue{
		gen:   1,
		space: make(chan struct{}), work: make(chan struct{}, 1),
		// The round in flight and the queue behind it share the buffer
		// limits: half each.
		maxRecs: max(cfg.MaxBufferedRecords/2, 1), maxBytes: max(cfg.MaxBufferedBytes/2, 1),
		flushAt: int(cfg.BatchMaxBytes),
	}
}

func (q *queue) wake() {
	select {
	case q.work <- struct{}{}:
	default:
	}
}

// push queues a record, waiting within ctx for room. It fails the record if
// the wait ends or the sink is closed, or if gen (not 0) is not the
// current generation: the record belongs to an event published before an
// Abort. A record larger than the whole queue is taken when the queue is
// empty. A record alone goes in a produce request of its own.
func (q *queue) push(ctx context.Context, r *kgo.Record, alone bool, pos *event.Position, gen uint64, done func(*kgo.Record, error)) {
	size := produce.RecordSize(r)
	for {
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			done(r, fmt.Errorf("%w: the sink is closed", ErrNotSent))
			return
		}
		if gen != 0 && gen != q.gen {
			q.mu.Unlock()
			done(r, errStale)
			return
		}
		n := len(q.items)
		// The open transaction's records leave room for the rest of the
		// buffers (the queue's half and the round's); the first record
		// of an empty queue is taken whatever its size once no
		// transaction holds any, so that a record larger than the queue
		// goes alone.
		room := q.held == 0 || n+q.held < 2*q.maxRecs && q.bytes+q.heldBytes+size <= 2*q.maxBytes
		if n == 0 && q.held == 0 || n < q.maxRecs && q.bytes+size <= q.maxBytes && room {
			if n == 0 {
				q.firstAt = time.Now()
			}
			it := queued{ctx: ctx, r: r, done: done, alone: alone, size: size}
			if pos != nil {
				it.pos, it.hasPos = *pos, true
			}
			q.items = append(q.items, it)
			q.bytes += size
			full := len(q.items) >= q.maxRecs || q.bytes >= q.flushAt
			q.mu.Unlock()
			if n == 0 || full {
				q.wake()
			}
			return
		}
		space := q.space
		waken := !room && !q.heldFull
		if !room {
			q.heldFull = true
		}
		q.mu.Unlock()
		if waken {
			q.wake()
		}
		select {
		case <-space:
		case <-ctx.Done():
			done(r, fmt.Errorf("wait for room in the producer's buffer: %w", ctx.Err()))
			return
		}
	}
}

// backlog reports whether a full round waits: as many records or bytes as
// make the flusher stop lingering.
func (q *queue) backlog() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) >= q.maxRecs || q.bytes >= q.flushAt
}

// setHeld sets the records (and their bytes) that the open transaction
// holds, and wakes the pushes waiting for room when that is fewer (each
// then says again whether it still waits for the transaction: heldFull).
func (q *queue) setHeld(records, bytes int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if records < q.held || bytes < q.heldBytes || records == 0 {
		close(q.space)
		q.space = make(chan struct{})
		q.heldFull = false
	}
	q.held, q.heldBytes = records, bytes
}

// waitsOnHeld reports whether a push waits for room that only the end of
// the open transaction frees (queue.heldFull).
func (q *queue) waitsOnHeld() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.heldFull
}

// generation returns the current generation (see queue.gen).
func (q *queue) generation() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.gen
}

// brokenNow returns the error that breaks the sink, if any.
func (q *queue) brokenNow() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.broken
}

// breakOn marks the sink broken by err unless it already is.
func (q *queue) breakOn(err error) {
	q.mu.Lock()
	if q.broken == nil {
		// The cause as text only: a record failed for another's sake
		// must not be taken for one that failed itself (dead-lettered
		// as too large, say).
		q.broken = fmt.Errorf("%w: an earlier record failed: %v", ErrNotSent, err)
		q.isBroken.Store(true)
	}
	q.mu.Unlock()
}

// take waits for records and returns the next round, with the error that
// breaks it, if any; ok is false once the queue is closed and empty. It
// lingers for up to linger after the round's first record, unless the round
// is full. With nothing queued at until (if not zero), it returns an empty
// round. If holds (exactly-once mode), the round's records count as held
// until the flusher says otherwise (setHeld); and while a push waits for
// the open transaction's room (heldFull), it neither lingers nor waits
// for until: the transaction is to commit now.
func (q *queue) take(linger time.Duration, spare []queued, until time.Time, holds bool) (round []queued, broken error, ok bool) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		q.mu.Lock()
		n := len(q.items)
		wait := time.Duration(0)
		full := holds && q.heldFull
		if n > 0 && !q.closed && !full && linger > 0 && n < q.maxRecs && q.bytes < q.flushAt && q.items[0].barrier == nil {
			wait = linger - time.Since(q.firstAt)
		}
		if n == 0 && q.closed {
			q.mu.Unlock()
			return nil, nil, false
		}
		if n == 0 && full {
			q.mu.Unlock()
			return spare[:0], nil, true
		}
		if n > 0 && wait <= 0 {
			round := q.items
			if holds {
				q.held += n
				q.heldBytes += q.bytes
			}
			q.items, q.bytes = spare[:0], 0
			close(q.space)
			q.space = make(chan struct{})
			broken := q.broken
			q.mu.Unlock()
			return round, broken, true
		}
		q.mu.Unlock()
		if n == 0 && !until.IsZero() {
			if wait = time.Until(until); wait <= 0 {
				return spare[:0], nil, true
			}
		}
		var tick <-chan time.Time
		if wait > 0 {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			tick = timer.C
		}
		select {
		case <-q.work:
		case <-tick:
		}
	}
}

// flush runs rounds until the queue is closed and empty. In exactly-once
// mode it also opens and ends the Kafka transactions (txn.go).
func (s *Sink) flush(ctx context.Context) {
	defer close(s.flushed)
	var spare []queued
	leaders := map[topicPartition]int32{} // the lanes' leaders, learnt once a round
	handed := map[string]int{}            // exactly-once mode: a topic's keyed records handed since the last flush (produce.WireSize)
	hand := func(it queued) {
		switch {
		case s.tx != nil:
			s.produceInTxn(it)
		case s.lanes != nil:
			s.lanes.send(ctx, it, leaders)
		default:
			s.client().Produce(it.ctx, it.r, it.done)
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
		round, broken, ok := s.q.take(s.cfg.Linger, spare, until, s.tx != nil)
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
			if s.tx != nil && it.barrier == nil && broken == nil && !it.alone && it.r.Key != nil {
				// Exactly-once mode: one transactional client, which
				// partitions the records itself. A topic's keyed records
				// past one batch's worth wait until what was handed is
				// answered, so that no partition's records are split
				// over produce requests in flight together (see lanes.run;
				// by topic, as the partition is not known yet: a round
				// trip per batch of a topic, only for rounds past that).
				w := produce.WireSize(it.r)
				if n := handed[it.r.Topic]; n > 0 && n+w > int(s.roundCapOf(it.r.Topic))-produce.BatchOverhead {
					_ = s.client().Flush(ctx)
					produced = false
					clear(handed)
					if broken = s.q.brokenNow(); broken != nil {
						it.done(it.r, broken)
						continue
					}
				}
				handed[it.r.Topic] += w
			}
			switch {
			case it.barrier != nil:
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
				s.q.mu.Lock()
				s.q.gen++
				if !s.q.closed {
					s.q.broken = nil
					s.q.isBroken.Store(false)
				}
				broken = s.q.broken
				s.q.mu.Unlock()
				close(it.barrier)
			case broken != nil:
				it.done(it.r, broken)
			case it.alone && s.lanes != nil:
				hand(it) // its lane sends it alone
			case it.alone:
				// What the round produced so far goes first, then this
				// record in a request of its own; a failure of either
				// breaks the rest of the round.
				if produced {
					_ = s.client().Flush(ctx)
					produced = false
					if broken = s.q.brokenNow(); broken != nil {
						it.done(it.r, broken)
						continue
					}
				}
				hand(it)
				_ = s.client().Flush(ctx)
				broken = s.q.brokenNow()
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
			if s.q.brokenNow() != nil {
				s.endTxn(ctx, false) // a record failed: abort at once
			} else if s.tx.commitDue(time.Now(), s.q.backlog()) || s.q.waitsOnHeld() {
				// Due, or the transaction and the queue fill the
				// buffers: nothing more can join it.
				s.endTxn(ctx, true)
			}
			s.q.setHeld(s.tx.holds())
		}
		s.waiting.Store(0)
		clear(round)
		spare = round[:0]
	}
}

// abort fails what is queued and what the client holds and has not sent,
// and returns once everything queued before it has been answered.
func (q *queue) abort(ctx context.Context, abortBuffered func(context.Context) error) error {
	q.breakOn(errors.New("aborted"))
	if abortBuffered != nil {
		if err := abortBuffered(ctx); err != nil {
			return fmt.Errorf("abort records not yet sent: %w", err)
		}
	}
	b := make(chan struct{})
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return fmt.Errorf("abort: %w: the sink is closed", ErrNotSent)
	}
	q.items = append(q.items, queued{barrier: b})
	q.mu.Unlock()
	q.wake()
	select {
	case <-b:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the aborted records to be answered: %w", ctx.Err())
	}
}

// close stops the queue: records queued later are failed, and so are the
// pushes waiting for room (woken here: in exactly-once mode one may wait
// for the open transaction's room with nothing queued, and the flusher
// then returns at once); the flusher returns once it has run the queued
// ones.
func (q *queue) close() {
	q.mu.Lock()
	if q.broken == nil {
		q.broken = fmt.Errorf("%w: the sink is closed", ErrNotSent)
		q.isBroken.Store(true)
	}
	q.closed = true
	close(q.space)
	q.space = make(chan struct{})
	q.mu.Unlock()
	q.wake()
}
