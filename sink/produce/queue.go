package produce

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
)

// The flusher hands records to the client in rounds, so that no record can be
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
// lanes of at-least-once mode avoid (Lanes): there the flusher hands each
// round to the brokers' lanes without waiting, and each lane runs rounds of
// its own as described here.

// ErrNotSent fails a record that was not sent because an earlier record
// failed, or because the sink was aborted or closed.
var ErrNotSent = errors.New("not sent")

// ErrStale fails a record pushed for an event published before the last
// Abort (Queue.gen); it breaks nothing: the session that published the
// event is over, and the event is published again.
var ErrStale = fmt.Errorf("%w: its event was published before an abort, and is published again after it", ErrNotSent)

// Item is a record waiting for its round, or an Abort barrier (R nil).
type Item struct {
	Ctx     context.Context
	R       *kgo.Record
	Done    func(*kgo.Record, error)
	Alone   bool // sent in a request of its own
	Size    int  // RecordSize(R)
	Barrier chan struct{}
	// Pos is the position of the record's event, for the position record
	// of an exactly-once transaction; HasPos is false for records of none.
	Pos    event.Position
	HasPos bool
}

// Queue holds the records of the next round. Its methods are safe for
// concurrent use; Take is the flusher's alone.
type Queue struct {
	mu      sync.Mutex
	items   []Item
	bytes   int
	firstAt time.Time     // when the first queued record arrived
	space   chan struct{} // closed, and replaced, when a round leaves the queue
	work    chan struct{} // the queue needs the flusher's attention
	broken  error         // set by a failure that fails later records; cleared by Abort
	// isBroken is broken != nil, read without mu: a lane looks at it
	// before it hands each record to its client (Lanes).
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
	// the flusher sets the transaction's count after each round (SetHeld),
	// and 0 when it ends.
	held, heldBytes int
	// heldFull: a push waits for room that only the end of the open
	// transaction frees (the transaction and the queue fill the
	// buffers): nothing more can join it, so the flusher takes what is
	// queued at once and commits. Cleared by SetHeld.
	heldFull bool
}

// NewQueue returns an empty queue for buffers of maxRecords records and
// maxBytes bytes (half for the queue, half for the round in flight), whose
// flusher stops lingering at flushAt bytes (the batch cap).
func NewQueue(maxRecords, maxBytes int, flushAt int32) *Queue {
	return &Queue{
		gen:   1,
		space: make(chan struct{}), work: make(chan struct{}, 1),
		// The round in flight and the queue behind it share the buffer
		// limits: half each.
		maxRecs: max(maxRecords/2, 1), maxBytes: max(maxBytes/2, 1),
		flushAt: int(flushAt),
	}
}

// Wake tells the flusher the queue needs its attention.
func (q *Queue) Wake() {
	select {
	case q.work <- struct{}{}:
	default:
	}
}

// Push queues a record, waiting within ctx for room. It fails the record if
// the wait ends or the sink is closed, or if gen (not 0) is not the
// current generation: the record belongs to an event published before an
// Abort. A record larger than the whole queue is taken when the queue is
// empty. A record alone goes in a produce request of its own.
func (q *Queue) Push(ctx context.Context, r *kgo.Record, alone bool, pos *event.Position, gen uint64, done func(*kgo.Record, error)) {
	size := RecordSize(r)
	for {
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			done(r, fmt.Errorf("%w: the sink is closed", ErrNotSent))
			return
		}
		if gen != 0 && gen != q.gen {
			q.mu.Unlock()
			done(r, ErrStale)
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
			it := Item{Ctx: ctx, R: r, Done: done, Alone: alone, Size: size}
			if pos != nil {
				it.Pos, it.HasPos = *pos, true
			}
			q.items = append(q.items, it)
			q.bytes += size
			full := len(q.items) >= q.maxRecs || q.bytes >= q.flushAt
			q.mu.Unlock()
			if n == 0 || full {
				q.Wake()
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
			q.Wake()
		}
		select {
		case <-space:
		case <-ctx.Done():
			done(r, fmt.Errorf("wait for room in the producer's buffer: %w", ctx.Err()))
			return
		}
	}
}

// Backlog reports whether a full round waits: as many records or bytes as
// make the flusher stop lingering.
func (q *Queue) Backlog() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) >= q.maxRecs || q.bytes >= q.flushAt
}

// SetHeld sets the records (and their bytes) that the open transaction
// holds, and wakes the pushes waiting for room when that is fewer (each
// then says again whether it still waits for the transaction: heldFull).
func (q *Queue) SetHeld(records, bytes int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if records < q.held || bytes < q.heldBytes || records == 0 {
		close(q.space)
		q.space = make(chan struct{})
		q.heldFull = false
	}
	q.held, q.heldBytes = records, bytes
}

// WaitsOnHeld reports whether a push waits for room that only the end of
// the open transaction frees (Queue.heldFull).
func (q *Queue) WaitsOnHeld() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.heldFull
}

// Generation returns the current generation (see Queue.gen).
func (q *Queue) Generation() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.gen
}

// BrokenNow returns the error that breaks the sink, if any.
func (q *Queue) BrokenNow() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.broken
}

// BreakOn marks the sink broken by err unless it already is.
func (q *Queue) BreakOn(err error) {
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

// Take waits for records and returns the next round, with the error that
// breaks it, if any; ok is false once the queue is closed and empty. It
// lingers for up to linger after the round's first record, unless the round
// is full. With nothing queued at until (if not zero), it returns an empty
// round. If holds (exactly-once mode), the round's records count as held
// until the flusher says otherwise (SetHeld); and while a push waits for
// the open transaction's room (heldFull), it neither lingers nor waits
// for until: the transaction is to commit now.
func (q *Queue) Take(linger time.Duration, spare []Item, until time.Time, holds bool) (round []Item, broken error, ok bool) {
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
		if n > 0 && !q.closed && !full && linger > 0 && n < q.maxRecs && q.bytes < q.flushAt && q.items[0].Barrier == nil {
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

// Abort fails what is queued and what the client holds and has not sent,
// and returns once everything queued before it has been answered.
func (q *Queue) Abort(ctx context.Context, abortBuffered func(context.Context) error) error {
	q.BreakOn(errors.New("aborted"))
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
	q.items = append(q.items, Item{Barrier: b})
	q.mu.Unlock()
	q.Wake()
	select {
	case <-b:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the aborted records to be answered: %w", ctx.Err())
	}
}

// Close stops the queue: records queued later are failed, and so are the
// pushes waiting for room (woken here: in exactly-once mode one may wait
// for the open transaction's room with nothing Item, and the flusher
// then returns at once); the flusher returns once it has run the Item
// ones.
func (q *Queue) Close() {
	q.mu.Lock()
	if q.broken == nil {
		q.broken = fmt.Errorf("%w: the sink is closed", ErrNotSent)
		q.isBroken.Store(true)
	}
	q.closed = true
	close(q.space)
	q.space = make(chan struct{})
	q.mu.Unlock()
	q.Wake()
}

// IsBroken reports, without the lock, whether a failure breaks the queue:
// a lane looks before it hands each record to its client.
func (q *Queue) IsBroken() bool { return q.isBroken.Load() }

// PassBarrier is the flusher's, at an Abort barrier once everything queued
// before it is answered: it opens the next generation and mends the queue
// unless it is closed, and returns what breaks it still.
func (q *Queue) PassBarrier() (broken error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.gen++
	if !q.closed {
		q.broken = nil
		q.isBroken.Store(false)
	}
	return q.broken
}

// Release appends items (a lane's records, routed by the flusher) in one
// piece unless the queue is closed, and wakes its flusher; it reports
// whether the queue was closed, the items then left to the caller.
func (q *Queue) Release(items []Item) (closed bool) {
	q.mu.Lock()
	closed = q.closed
	if !closed {
		q.items = append(q.items, items...)
	}
	q.mu.Unlock()
	q.Wake()
	return closed
}

// Barrier appends a barrier, closed or not, and returns what the flusher
// closes once everything queued before it is answered.
func (q *Queue) Barrier() chan struct{} {
	b := make(chan struct{})
	q.mu.Lock()
	q.items = append(q.items, Item{Barrier: b})
	q.mu.Unlock()
	q.Wake()
	return b
}

// Len returns the number of records queued.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

// MaxRecords returns the records the queue takes before a push waits: its
// half of the buffers.
func (q *Queue) MaxRecords() int { return q.maxRecs }
