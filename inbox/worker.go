package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/backoff"
	"github.com/walrelay/walrelay/internal/faultinject"
	"github.com/walrelay/walrelay/sink"
)

// errNoID is the failure of a record without an id header: it cannot be
// deduplicated, so it is dead-lettered instead of handled.
var errNoID = errors.New(`the record has no "id" header: it cannot be deduplicated`)

// worker handles one partition's records, in order, until stopped.
type worker struct {
	c  *Consumer
	cl *kgo.Client
	tp topicPartition

	mu     sync.Mutex
	queue  []*kgo.Record
	hwm    int64
	paused bool
	wake   chan struct{}

	stopOnce sync.Once
	stopCh   chan struct{}      // closed by stop: no new batch
	ctx      context.Context    // the handlers' context
	cancel   context.CancelFunc // cancels ctx: an abort
	done     chan struct{}

	// The worker goroutine's own: failures of the record at the head.
	attempts  int
	firstFail time.Time
	connFails int
}

func newWorker(c *Consumer, cl *kgo.Client, tp topicPartition) *worker {
	ctx, cancel := context.WithCancel(context.Background())
	return &worker{c: c, cl: cl, tp: tp, wake: make(chan struct{}, 1), stopCh: make(chan struct{}), ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

// push queues records fetched for the partition; fetching pauses while
// MaxBufferedRecords wait.
func (w *worker) push(recs []*kgo.Record, hwm int64) {
	w.mu.Lock()
	w.queue = append(w.queue, recs...)
	w.hwm = hwm
	pause := !w.paused && len(w.queue) >= w.c.cfg.MaxBufferedRecords
	w.paused = w.paused || pause
	w.mu.Unlock()
	if pause {
		w.cl.PauseFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// pop drops the first n queued records (handled or dead-lettered).
func (w *worker) pop(n int) {
	w.mu.Lock()
	w.queue = w.queue[n:]
	if len(w.queue) == 0 {
		w.queue = nil
	}
	resume := w.paused && len(w.queue) < w.c.cfg.MaxBufferedRecords/2
	w.paused = w.paused && !resume
	w.mu.Unlock()
	if resume {
		w.cl.ResumeFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
	}
}

// resume resumes fetching a partition paused by this worker: a pause
// outlives the assignment in the client.
func (w *worker) resume() {
	w.mu.Lock()
	paused := w.paused
	w.paused = false
	w.mu.Unlock()
	if paused {
		w.cl.ResumeFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
	}
}

// stop ends the worker after its current batch; abort also cancels the
// batch's handlers (its transaction rolls back).
func (w *worker) stop(abort bool) {
	w.stopOnce.Do(func() { close(w.stopCh) })
	if abort {
		w.cancel()
	}
}

// next returns the next batch's records, or nil once stopped. A record
// that failed is retried alone.
func (w *worker) next() []*kgo.Record {
	for {
		select {
		case <-w.stopCh:
			return nil
		default:
		}
		w.mu.Lock()
		n := min(len(w.queue), w.c.cfg.BatchMaxRecords)
		if w.attempts > 0 {
			n = min(n, 1)
		}
		recs := w.queue[:n:n]
		w.mu.Unlock()
		if n > 0 {
			return recs
		}
		select {
		case <-w.wake:
		case <-w.stopCh:
			return nil
		}
	}
}

// sleep waits d, or until stopped (false).
func (w *worker) sleep(d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-w.stopCh:
		return false
	}
}

func (w *worker) run() {
	defer close(w.done)
	defer w.cancel()
	c := w.c
	for {
		recs := w.next()
		if recs == nil {
			return
		}
		n, err := w.batch(recs)
		if n > 0 {
			w.pop(n)
			w.attempts = 0
		}
		if err == nil {
			w.connFails = 0
			continue
		}
		if w.ctx.Err() != nil {
			return // aborted: the batch rolled back
		}
		head := recs[n]
		switch {
		case errors.Is(err, errNoID):
			w.deadLetter(head, "no_id", err)
		case !isHandlerError(err) && connectionTrouble(err):
			w.connFails++
			wait := backoff.Wait(c.cfg.RetryBackoffMin, c.cfg.RetryBackoffMax, w.connFails-1)
			c.log.Warn("database unavailable; retrying", "topic", w.tp.topic, "partition", w.tp.partition, "offset", head.Offset, "err", err, "retry_in", wait)
			w.sleep(wait)
		default:
			w.attempts++
			if w.attempts == 1 {
				w.firstFail = time.Now()
			}
			if w.attempts >= c.cfg.MaxAttempts {
				w.deadLetter(head, "handler_failed", err)
				continue
			}
			c.m.retries.WithLabelValues(w.tp.topic).Inc()
			wait := backoff.Wait(c.cfg.RetryBackoffMin, c.cfg.RetryBackoffMax, w.attempts-1)
			c.log.Warn("handler failed; retrying", "topic", w.tp.topic, "partition", w.tp.partition, "offset", head.Offset, "id", sink.Header(head, "id"),
				"attempt", w.attempts, "max_attempts", c.cfg.MaxAttempts, "err", err, "retry_in", wait)
			w.sleep(wait)
		}
	}
}

// batch handles recs in order in one transaction, a savepoint per record,
// until one fails, BatchMaxTime passes, or a record without id comes
// after the first. It commits the records before the failure and marks
// the last one's offset, and returns how many it committed and the
// failure of recs[n], if any.
func (w *worker) batch(recs []*kgo.Record) (int, error) {
	c := w.c
	ctx := w.ctx
	if sink.Header(recs[0], "id") == "" {
		return 0, errNoID
	}
	start := time.Now()
	tx, err := c.cfg.Postgres.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin a transaction: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op after Commit
	done, handled, dups := 0, 0, 0
	var failure error
	for i, r := range recs {
		if i > 0 && time.Since(start) >= c.cfg.BatchMaxTime {
			break
		}
		m := message(r, 1)
		if m.ID == "" {
			break // at the head of the next batch: dead-lettered
		}
		if i == 0 {
			m.Attempt = w.attempts + 1
		}
		fresh, err := w.claim(ctx, tx, m.ID, i > 0)
		if err != nil {
			return 0, fmt.Errorf("claim event %s in %s: %w", m.ID, c.table, err)
		}
		if !fresh {
			dups++
			done = i + 1
			continue
		}
		if err := w.call(ctx, tx, m); err != nil {
			if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT walrelay_inbox"); rerr != nil {
				return 0, fmt.Errorf("roll back event %s after its handler failed (%v): %w", m.ID, err, rerr)
			}
			failure = &handlerError{fmt.Errorf("handle event %s (%s/%d at offset %d): %w", m.ID, r.Topic, r.Partition, r.Offset, err)}
			break
		}
		handled++
		done = i + 1
	}
	if done == 0 {
		return 0, failure
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit the inbox transaction: %w", err)
	}
	faultinject.Reached("inbox_committed")
	w.mark(recs[done-1])
	c.m.commits.Inc()
	c.m.handled.WithLabelValues(w.tp.topic).Add(float64(handled))
	c.m.duplicates.WithLabelValues(w.tp.topic).Add(float64(dups))
	return done, failure
}

// claim claims id for the consumer in tx, after a savepoint that undoes
// the claim with the record's changes if its handler fails; release
// releases the previous record's savepoint first. One round trip.
func (w *worker) claim(ctx context.Context, tx pgx.Tx, id string, release bool) (bool, error) {
	b := &pgx.Batch{}
	if release {
		b.Queue("RELEASE SAVEPOINT walrelay_inbox")
	}
	b.Queue("SAVEPOINT walrelay_inbox")
	var fresh bool
	b.Queue("SELECT "+w.c.claim+"($1, $2)", w.c.cfg.Consumer, id).QueryRow(func(row pgx.Row) error { return row.Scan(&fresh) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return false, err
	}
	return fresh, nil
}

// call runs the handler; a panic is its error.
func (w *worker) call(ctx context.Context, tx pgx.Tx, m Message) (err error) {
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v", p)
			w.c.log.Error("handler panicked", "id", m.ID, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		}
		w.c.m.latency.Observe(time.Since(start).Seconds())
	}()
	return w.c.h(ctx, tx, m)
}

// mark marks r's offset for commit: every record up to it is handled,
// skipped as a duplicate, or dead-lettered.
func (w *worker) mark(r *kgo.Record) {
	w.cl.MarkCommitRecords(r)
	w.mu.Lock()
	hwm := w.hwm
	w.mu.Unlock()
	w.c.m.lag.WithLabelValues(w.tp.topic, strconv.Itoa(int(w.tp.partition))).Set(float64(max(0, hwm-r.Offset-1)))
}

// deadLetter sends r to the dead-letter topic, retrying until the broker
// acknowledges it or the worker stops, then marks it and moves on. A
// refusal that retrying cannot fix (authorization) stops the consumer.
func (w *worker) deadLetter(r *kgo.Record, reason string, cause error) {
	c := w.c
	now := time.Now().UTC()
	first := w.firstFail
	if w.attempts == 0 {
		first = now
	}
	h := append([]kgo.RecordHeader(nil), r.Headers...)
	h = append(h,
		kgo.RecordHeader{Key: sink.HeaderReason, Value: []byte(reason)},
		kgo.RecordHeader{Key: sink.HeaderError, Value: []byte(cause.Error())},
		kgo.RecordHeader{Key: sink.HeaderAttempts, Value: []byte(strconv.Itoa(w.attempts))},
		kgo.RecordHeader{Key: sink.HeaderFirstFailure, Value: []byte(first.UTC().Format(time.RFC3339Nano))},
		kgo.RecordHeader{Key: sink.HeaderLastFailure, Value: []byte(now.Format(time.RFC3339Nano))},
		kgo.RecordHeader{Key: sink.HeaderTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: sink.HeaderPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
		kgo.RecordHeader{Key: sink.HeaderOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
		kgo.RecordHeader{Key: sink.HeaderConsumer, Value: []byte(c.cfg.Consumer)},
	)
	dl := &kgo.Record{Topic: c.cfg.DeadLetterTopic, Key: r.Key, Value: r.Value, Headers: h}
	c.log.Warn("dead-lettering a record", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "id", sink.Header(r, "id"), "reason", reason, "attempts", w.attempts, "err", cause)
	for try := 0; ; try++ {
		err := w.cl.ProduceSync(w.ctx, dl).FirstErr()
		if err == nil {
			break
		}
		switch {
		case w.ctx.Err() != nil:
			return
		case errors.Is(err, kerr.MessageTooLarge) && dl.Value != nil:
			dl.Headers = append(dl.Headers, kgo.RecordHeader{Key: sink.HeaderOmitted, Value: []byte(strconv.Itoa(len(dl.Value)))})
			dl.Value = nil
			continue
		case errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed):
			c.fail(fmt.Errorf("dead-letter a record of %s/%d at offset %d to %s: %w", r.Topic, r.Partition, r.Offset, c.cfg.DeadLetterTopic, err))
			return
		}
		wait := backoff.Wait(c.cfg.RetryBackoffMin, c.cfg.RetryBackoffMax, try)
		c.log.Warn("dead-letter topic unavailable; retrying", "topic", c.cfg.DeadLetterTopic, "err", err, "retry_in", wait)
		if !w.sleep(wait) {
			return
		}
	}
	w.mark(r)
	w.pop(1)
	w.attempts = 0
	c.m.deadLettered.WithLabelValues(r.Topic, reason).Inc()
}

// message is the Message of r.
func message(r *kgo.Record, attempt int) Message {
	m := Message{Key: r.Key, Value: r.Value, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp,
		Headers: make(map[string][]byte, len(r.Headers)), Attempt: attempt}
	for _, h := range r.Headers {
		m.Headers[h.Key] = h.Value
	}
	m.ID, m.Type = string(m.Headers["id"]), string(m.Headers["type"])
	return m
}
