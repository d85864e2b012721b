package sink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/walrelay/walrelay/event"
)

// The sink hands records to the client so that no record can be written
// ahead of an earlier one of its key that failed.
//
// When a produce request fails for good, the client fails every record it
// holds for that partition, but walrelay learns of it only when the failed
// record's callback runs, later, on another goroutine. A record produced in
// between would start a new batch and could be written before the failed
// record is sent again. So a record goes to the client only once every record
// of its key sent before it has been answered (records of one key taken
// together go together); the others wait for their key (keys.go). Records
// published meanwhile wait in the queue. If a record failed in a way that
// fails later ones (anything but a failure of that record alone, which is
// dead-lettered), the sink is broken: every queued or waiting record is
// failed with ErrNotSent, unsent, until Abort. The caller restarts from the
// failed record.
//
// So a slow broker holds back only the keys of the partitions it leads: the
// other keys' records go to their brokers as they come. The client keeps up
// to five produce requests in flight per broker and lingers to fill them.
//
// In exactly-once mode the client flushes manually, in rounds: the flusher
// takes every record queued so far, hands all of them to the client and
// flushes; Flush returns once every record of the round has been answered
// and its callback has run. A Kafka transaction spans every partition, and
// its commit waits for all of them anyway.

// ErrNotSent fails a record that was not sent because an earlier record
// failed, or because the sink was aborted or closed.
var ErrNotSent = errors.New("not sent")

// errStale fails a record pushed for an event published before the last
// Abort (queue.gen); it breaks nothing: the session that published the
// event is over, and the event is published again.
var errStale = fmt.Errorf("%w: its event was published before an abort, and is published again after it", ErrNotSent)

// queued is a record waiting to be sent, or an Abort barrier (r nil).
type queued struct {
	ctx     context.Context
	r       *kgo.Record
	key     string // what orders the record: its event's aggregate id
	broker  int32  // the leader of its partition when first placed (keys.go), or -1
	routed  bool   // broker is set
	done    func(*kgo.Record, error)
	alone   bool // sent in a request of its own
	barrier chan struct{}
	// pos is the position of the record's event, for the position record
	// of an exactly-once transaction; hasPos is false for records of none.
	pos    event.Position
	hasPos bool
}

// queue holds the records not yet sent.
type queue struct {
	mu      sync.Mutex
	items   []queued
	bytes   int
	firstAt time.Time     // when the first queued record arrived
	space   chan struct{} // closed, and replaced, when records leave the queue and pushes wait
	work    chan struct{} // the queue needs the flusher's attention
	broken  error         // set by a failure that fails later records; cleared by Abort
	closed  bool
	waiters int // pushes waiting for space
	// held and heldBytes count the records taken from the queue that wait
	// for their key (keys.go): they count against the queue's limits.
	held, heldBytes int
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
}

func newQueue(cfg Config) *queue {
	return &queue{
		gen:   1,
		space: make(chan struct{}), work: make(chan struct{}, 1),
		// The records with the client and those queued or waiting
		// behind them share the buffer limits: half each (sink.go).
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
func (q *queue) push(ctx context.Context, r *kgo.Record, key string, alone bool, pos *event.Position, gen uint64, done func(*kgo.Record, error)) {
	size := recordSize(r)
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
		if n := len(q.items) + q.held; n == 0 || n < q.maxRecs && q.bytes+q.heldBytes+size <= q.maxBytes {
			if len(q.items) == 0 {
				q.firstAt = time.Now()
			}
			it := queued{ctx: ctx, r: r, key: key, done: done, alone: alone}
			if pos != nil {
				it.pos, it.hasPos = *pos, true
			}
			q.items = append(q.items, it)
			q.bytes += size
			full := len(q.items) >= q.maxRecs || q.bytes >= q.flushAt
			first := len(q.items) == 1
			q.mu.Unlock()
			if first || full {
				q.wake()
			}
			return
		}
		space := q.space
		q.waiters++
		q.mu.Unlock()
		select {
		case <-space:
		case <-ctx.Done():
			q.mu.Lock()
			q.waiters--
			q.mu.Unlock()
			done(r, fmt.Errorf("wait for room in the producer's buffer: %w", ctx.Err()))
			return
		}
		q.mu.Lock()
		q.waiters--
		q.mu.Unlock()
	}
}

// freed tells the pushes waiting for space that there may be some. The
// caller holds q.mu.
func (q *queue) freed() {
	if q.waiters > 0 {
		close(q.space)
		q.space = make(chan struct{})
	}
}

// hold and unhold count n records of size bytes out of the queue and
// waiting for their key, or no longer.
func (q *queue) hold(n, size int) {
	q.mu.Lock()
	q.held, q.heldBytes = q.held+n, q.heldBytes+size
	q.mu.Unlock()
}

func (q *queue) unhold(n, size int) {
	q.mu.Lock()
	q.held, q.heldBytes = q.held-n, q.heldBytes-size
	q.freed()
	q.mu.Unlock()
}

// takeAll returns every queued record (none if none) with the error that
// breaks the sink, if any; closed is true once the queue is closed.
func (q *queue) takeAll(spare []queued) (round []queued, broken error, closed bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return nil, q.broken, q.closed
	}
	round = q.items
	q.items, q.bytes = spare[:0], 0
	q.freed()
	return round, q.broken, q.closed
}

// backlog reports whether a full round waits: as many records or bytes as
// make the flusher stop lingering.
func (q *queue) backlog() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) >= q.maxRecs || q.bytes >= q.flushAt
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
	}
	q.mu.Unlock()
}

// take waits for records and returns the next round, with the error that
// breaks it, if any; ok is false once the queue is closed and empty. It
// lingers for up to linger after the round's first record, unless the round
// is full. With nothing queued at until (if not zero), it returns an empty
// round.
func (q *queue) take(linger time.Duration, spare []queued, until time.Time) (round []queued, broken error, ok bool) {
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
		if n > 0 && !q.closed && linger > 0 && n < q.maxRecs && q.bytes < q.flushAt && q.items[0].barrier == nil {
			wait = linger - time.Since(q.firstAt)
		}
		if n == 0 && q.closed {
			q.mu.Unlock()
			return nil, nil, false
		}
		if n > 0 && wait <= 0 {
			round := q.items
			q.items, q.bytes = spare[:0], 0
			q.freed()
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

// flush sends what is queued until the queue is closed and empty: by key
// and broker (keys.go) in at-least-once mode, in rounds in exactly-once
// mode, where it also opens and ends the Kafka transactions (txn.go).
func (s *Sink) flush(ctx context.Context) {
	defer close(s.flushed)
	if s.tx == nil {
		s.flushByKey(ctx)
	} else {
		s.flushRounds(ctx)
	}
}

// flushRounds runs rounds, in Kafka transactions, until the queue is closed
// and empty.
func (s *Sink) flushRounds(ctx context.Context) {
	var spare []queued
	for {
		round, broken, ok := s.q.take(s.cfg.Linger, spare, s.tx.commitBy())
		if !ok {
			// Closed: what the caller did not wait for is aborted.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s.endTxn(ctx, false)
			cancel()
			return
		}
		produced := false
		for _, it := range round {
			switch {
			case it.barrier != nil:
				// Everything queued before Abort is answered and the open
				// transaction ended: produce again, unless the sink
				// closed meanwhile.
				if produced {
					_ = s.cl.Flush(ctx)
					produced = false
				}
				s.endTxn(ctx, true)
				broken = s.q.pass(it.barrier)
			case broken != nil:
				it.done(it.r, broken)
			case it.alone:
				// What the round produced so far goes first, then this
				// record in a request of its own; a failure of either
				// breaks the rest of the round.
				if produced {
					_ = s.cl.Flush(ctx)
					produced = false
					if broken = s.q.brokenNow(); broken != nil {
						it.done(it.r, broken)
						continue
					}
				}
				s.produceInTxn(it)
				_ = s.cl.Flush(ctx)
				broken = s.q.brokenNow()
			default:
				s.produceInTxn(it)
				produced = true
			}
		}
		if produced {
			// Returns once every record of the round is answered, or
			// when Close cancels ctx (the client then fails the rest).
			_ = s.cl.Flush(ctx)
		}
		if s.q.brokenNow() != nil {
			s.endTxn(ctx, false) // a record failed: abort at once
		} else if s.tx.commitDue(time.Now(), s.q.backlog()) {
			s.endTxn(ctx, true)
		}
		clear(round)
		spare = round[:0]
	}
}

// pass lets an Abort's barrier b go, once everything queued before it is
// answered: the generation moves on and the sink sends again, unless it
// closed meanwhile. It returns the error that breaks the sink now.
func (q *queue) pass(b chan struct{}) error {
	q.mu.Lock()
	q.gen++
	if !q.closed {
		q.broken = nil
	}
	broken := q.broken
	q.mu.Unlock()
	close(b)
	return broken
}

// abort fails what is queued and what the client holds and has not sent,
// and returns once everything queued before it has been answered.
func (q *queue) abort(ctx context.Context, cl *kgo.Client, transactional bool) error {
	q.breakOn(errors.New("aborted"))
	// In a transaction the flusher ends it at the barrier instead: the
	// client's transactional calls must not run concurrently.
	if !transactional {
		if err := cl.AbortBufferedRecords(ctx); err != nil {
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

// close stops the queue: records queued later are failed, and the flusher
// returns once it has run the queued ones.
func (q *queue) close() {
	q.mu.Lock()
	if q.broken == nil {
		q.broken = fmt.Errorf("%w: the sink is closed", ErrNotSent)
	}
	q.closed = true
	q.mu.Unlock()
	q.wake()
}

// recordSize is what a record counts against the buffer limits: its key,
// value and headers, as the client counts it.
func recordSize(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}
