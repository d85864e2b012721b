package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/walrelay/walrelay/internal/backoff"
	"github.com/walrelay/walrelay/internal/deadletter"
	"github.com/walrelay/walrelay/internal/faultinject"
	"github.com/walrelay/walrelay/sink"
)

// The failures of a record whose event id cannot be read: it cannot be
// deduplicated, so it is dead-lettered (with the reason idReason gives)
// instead of handled.
var (
	errNoID       = errors.New(`the record has no "id" header: it cannot be deduplicated`)
	errEmptyID    = errors.New(`the record's "id" header is empty: it cannot be deduplicated`)
	errSeveralIDs = errors.New(`the record has several "id" headers (a header column published as "id"?): which one is the event id is unknown`)
)

// eventID is r's event id: the value of its one "id" header, the only
// reading of it (the claim, the handler's Message, logs and dead
// letters). A record with none, an empty one or several fails with
// errNoID, errEmptyID or errSeveralIDs.
func eventID(r *kgo.Record) (string, error) {
	var id []byte
	n := 0
	for _, h := range r.Headers {
		if h.Key == "id" {
			id = h.Value
			n++
		}
	}
	switch {
	case n == 0:
		return "", errNoID
	case n > 1:
		return "", errSeveralIDs
	case len(id) == 0:
		return "", errEmptyID
	}
	return string(id), nil
}

// idReason is the dead-letter reason of an eventID failure, "" for any
// other error.
func idReason(err error) string {
	switch {
	case errors.Is(err, errNoID):
		return "no_id"
	case errors.Is(err, errEmptyID):
		return "empty_id"
	case errors.Is(err, errSeveralIDs):
		return "several_ids"
	}
	return ""
}

// logID is r's event id for a log line or a dead letter's log: "" if it
// has none or several.
func logID(r *kgo.Record) string {
	id, _ := eventID(r)
	return id
}

// abortGrace bounds how long a stop waits for a batch whose handlers'
// context it cancelled, ShutdownTimeout at most: a handler that ignores
// its context is then abandoned (worker.abandon).
const abortGrace = 2 * time.Second

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

	// The batch in flight (under mu): the backend of its transaction and
	// the record whose handler runs, for abandon.
	pid     uint32
	current *kgo.Record

	// The worker goroutine's own: failures of the record at the head.
	attempts  int
	firstFail time.Time
	connFails int
	// regFails counts the head's failures in a row because the schema
	// registry was unavailable (ErrRegistryUnavailable): not attempts.
	regFails int
	// cuts counts the times the session of the head's transaction ended
	// while its handler ran, for no cause blame could pin on the handler
	// nor rule out (sessionCut): not attempts, but bounded by maxCuts.
	cuts int
	// Of the last batch: its transaction's start, and the longest run of
	// one of its handlers (the one running when it failed included).
	txStart    time.Time
	longestRun time.Duration
	// handlerState is the SQLSTATE of the error the last batch's failing
	// handler returned, if any (the server's reason for ending a session
	// reaches the handler's statement first).
	handlerState string
	// pgStarted is the server's pg_postmaster_start_time as this worker
	// last saw it (blame), or the consumer's when it was created (newWorker
	// runs under c.mu).
	pgStarted time.Time
	// runs counts the handler's runs of each queued record that ran in a
	// transaction that did not commit (by offset; dropped when popped):
	// Message.Attempt.
	runs map[int64]int
	// isolate: records up to this offset are handled one per transaction,
	// to find which handler broke the connection of a batch.
	isolate int64
}

func newWorker(c *Consumer, cl *kgo.Client, tp topicPartition) *worker {
	ctx, cancel := context.WithCancel(context.Background())
	return &worker{c: c, cl: cl, tp: tp, wake: make(chan struct{}, 1), stopCh: make(chan struct{}), ctx: ctx, cancel: cancel, done: make(chan struct{}), isolate: -1,
		pgStarted: c.pgStarted, runs: map[int64]int{}}
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
	for _, r := range w.queue[:n] {
		delete(w.runs, r.Offset)
	}
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
		if w.attempts > 0 || (n > 0 && w.queue[0].Offset <= w.isolate) {
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
		n, ran, err := w.batch(recs)
		if n > 0 {
			w.pop(n)
			w.attempts, w.cuts = 0, 0
		}
		if err == nil {
			if w.regFails > 0 {
				w.c.m.registryHeld.WithLabelValues(w.tp.topic, strconv.Itoa(int(w.tp.partition))).Set(0)
			}
			w.connFails, w.regFails = 0, 0
			continue
		}
		if w.ctx.Err() != nil {
			return // aborted: the batch rolled back
		}
		head := recs[n]
		if len(ran) > 0 && !isHandlerError(err) && idReason(err) == "" {
			// The transaction failed in the inbox's own work (a claim, a
			// savepoint's rollback, the commit) after handlers ran in it.
			switch kind, why := w.blame(err); kind {
			case handlersFault:
				// Which handler's, when several ran, is found by handling
				// them one at a time; the others are not counted.
				if len(ran) > 1 || ran[0] != 0 {
					w.isolate = recs[ran[len(ran)-1]].Offset
					c.log.Warn("a transaction failed after handlers ran; handling those records one per transaction to find which caused it",
						"topic", w.tp.topic, "partition", w.tp.partition, "from_offset", head.Offset, "to_offset", w.isolate, "cause", why, "err", err)
					continue
				}
				err = &handlerError{fmt.Errorf("the transaction of event %s (%s/%d at offset %d) failed after its handler ran (%s): %w",
					logID(head), head.Topic, head.Partition, head.Offset, why, err)}
			case sessionCut:
				w.cuts++
				if w.cuts < maxCuts {
					wait := backoff.Wait(c.cfg.RetryBackoffMin, c.cfg.RetryBackoffMax, w.cuts-1)
					c.log.Warn("the session of a transaction ended while its handlers ran, for no cause of theirs that could be seen (pg_terminate_backend, a proxy or the network?); retrying, not counted as an attempt",
						"topic", w.tp.topic, "partition", w.tp.partition, "offset", head.Offset, "id", logID(head), "cuts", w.cuts, "max_cuts", maxCuts, "err", err, "retry_in", wait)
					w.sleep(wait)
					continue
				}
				if len(ran) > 1 || ran[0] != 0 {
					w.isolate, w.cuts = recs[ran[len(ran)-1]].Offset, 0
					continue
				}
				w.deadLetter(head, "handler_failed", fmt.Errorf("the session of the transaction of event %s (%s/%d at offset %d) ended %d times in a row while its handler ran (does it end its own backend?): %w",
					logID(head), head.Topic, head.Partition, head.Offset, w.cuts, err))
				continue
			}
		}
		switch {
		case idReason(err) != "":
			w.deadLetter(head, idReason(err), err)
		case isHandlerError(err) && errors.Is(err, ErrUndecodable):
			// Its key or value will not decode on another try.
			w.attempts++
			if w.attempts == 1 {
				w.firstFail = time.Now()
			}
			w.deadLetter(head, "undecodable", err)
		case isHandlerError(err) && errors.Is(err, ErrRegistryUnavailable):
			// Not the record's fault: as the database being down.
			// Wrong credentials too: held (nothing lost), but said so.
			w.regFails++
			wait := backoff.Wait(c.cfg.RetryBackoffMin, c.cfg.RetryBackoffMax, w.regFails-1)
			msg, reason := "schema registry unavailable; holding the partition, retrying, not counted as an attempt", "unavailable"
			if errors.Is(err, ErrRegistryRefused) {
				msg, reason = "schema registry refused the consumer's credentials (check RegistryConfig.Username and Password); holding the partition, retrying, not counted as an attempt", "credentials"
			}
			c.m.registryWaits.WithLabelValues(w.tp.topic, reason).Inc()
			c.m.registryHeld.WithLabelValues(w.tp.topic, strconv.Itoa(int(w.tp.partition))).Set(1)
			c.log.Warn(msg, "topic", w.tp.topic, "partition", w.tp.partition, "offset", head.Offset, "id", logID(head),
				"failures", w.regFails, "err", err, "retry_in", wait)
			w.sleep(wait)
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
			c.log.Warn("handler failed; retrying", "topic", w.tp.topic, "partition", w.tp.partition, "offset", head.Offset, "id", logID(head),
				"attempt", w.attempts, "max_attempts", c.cfg.MaxAttempts, "err", err, "retry_in", wait)
			w.sleep(wait)
		}
	}
}

// batch handles recs in order in one transaction, a savepoint per record,
// until one fails, BatchMaxTime passes, or a record whose id cannot be
// read comes after the first. It commits the records before the failure
// and marks the last one's offset, and returns how many it committed, the
// indexes of the records whose handlers ran in a transaction that did not
// commit, and the failure of recs[n], if any.
func (w *worker) batch(recs []*kgo.Record) (n int, ranOut []int, err error) {
	c := w.c
	ctx := w.ctx
	// The records' process spans (Config.TracerProvider), ended with the
	// transaction: committed, or not.
	var spans []openSpan
	failed := -1
	var failure error
	if c.tracer != nil {
		defer func() {
			txErr := err
			if txErr == failure {
				txErr = nil // the records before the failed one committed
			}
			endSpans(spans, n, failed, failure, txErr)
		}()
	}
	if _, err := eventID(recs[0]); err != nil {
		return 0, nil, err
	}
	start := time.Now()
	w.txStart, w.longestRun, w.handlerState = start, 0, ""
	// READ COMMITTED whatever the pool's default: a claim's snapshot must
	// be taken after it waited for a claim of the same event in flight,
	// which a REPEATABLE READ transaction's is not (the claims refuse it).
	tx, err := c.cfg.Postgres.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return 0, nil, fmt.Errorf("begin a transaction: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op after Commit
	defer w.busy(0, nil)                    // before the rollback: abandon never ends a backend the pool handed on
	done, handled, dups := 0, 0, 0
	var ran []int
	for i, r := range recs {
		if i > 0 && time.Since(start) >= c.cfg.BatchMaxTime {
			break
		}
		id, err := eventID(r)
		if err != nil {
			break // at the head of the next batch: dead-lettered
		}
		m := message(r, id, 1)
		m.reg = c.cfg.Registry
		hctx, span := c.startSpan(ctx, r, id)
		if span != nil {
			spans = append(spans, openSpan{span, i})
		}
		fresh, err := w.claim(ctx, tx, r.Topic, m.ID, i > 0)
		if err != nil {
			return 0, ran, fmt.Errorf("claim event %s of %s in %s: %w", m.ID, r.Topic, c.table, err)
		}
		if !fresh {
			if span != nil {
				span.SetAttributes(attrDuplicate.Bool(true))
			}
			dups++
			done = i + 1
			continue
		}
		ran = append(ran, i)
		// Attempt counts this record's runs, whatever ended the ones
		// before (a failure, a cut, a restart, a batch's commit that
		// failed and is retried one record per transaction).
		w.runs[r.Offset]++
		m.Attempt = w.runs[r.Offset]
		if span != nil {
			span.SetAttributes(attrAttempt.Int(m.Attempt))
		}
		w.busy(tx.Conn().PgConn().PID(), r)
		began := time.Now()
		err = w.call(hctx, tx, m)
		w.longestRun = max(w.longestRun, time.Since(began))
		if err != nil {
			w.handlerState = sqlState(err)
			if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT walrelay_inbox"); rerr != nil {
				return 0, ran, fmt.Errorf("roll back event %s after its handler failed (%v): %w", m.ID, err, rerr)
			}
			failure = &handlerError{fmt.Errorf("handle event %s (%s/%d at offset %d): %w", m.ID, r.Topic, r.Partition, r.Offset, err)}
			failed = i
			break
		}
		handled++
		done = i + 1
	}
	if done == 0 {
		return 0, nil, failure
	}
	if err := ctx.Err(); err != nil {
		return 0, nil, fmt.Errorf("the batch was aborted: %w", err) // rolled back: its records are handled again by the next owner
	}
	w.busy(0, nil) // the connection goes back to the pool with the commit
	if err := tx.Commit(ctx); err != nil {
		return 0, ran, fmt.Errorf("commit the inbox transaction: %w", err)
	}
	faultinject.Reached("inbox_committed")
	w.mark(recs[done-1])
	c.m.commits.Inc()
	c.m.handled.WithLabelValues(w.tp.topic).Add(float64(handled))
	c.m.duplicates.WithLabelValues(w.tp.topic).Add(float64(dups))
	return done, nil, failure
}

// busy records the backend of the batch's transaction and the record
// whose handler runs there (0 and nil: none).
func (w *worker) busy(pid uint32, r *kgo.Record) {
	w.mu.Lock()
	w.pid, w.current = pid, r
	w.mu.Unlock()
}

// abandon gives up on a worker whose handler ignores its context's end:
// it ends the backend of the handler's transaction, so that the
// transaction rolls back and the event's claim is released at once (the
// partition's next owner would otherwise wait on it), and leaves the
// handler's goroutine to return when it will; nothing of its batch
// commits, and its offset is not marked, so the event is handled again by
// whoever consumes the partition next.
func (w *worker) abandon() {
	c := w.c
	w.mu.Lock() // held while ending the backend: batch cannot hand its connection back to the pool meanwhile
	defer w.mu.Unlock()
	args := []any{"topic", w.tp.topic, "partition", w.tp.partition}
	if r := w.current; r != nil {
		args = append(args, "offset", r.Offset, "id", logID(r))
	}
	if w.pid == 0 {
		c.log.Error("a partition's worker did not stop in time; abandoning it", args...)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.cfg.Postgres.Exec(ctx, "SELECT pg_terminate_backend($1)", int32(w.pid))
	c.log.Error("a handler ignored the end of its context; ending its transaction's backend and abandoning it: the event is handled again by the partition's next owner",
		append(args, "backend_pid", w.pid, "terminate_err", err)...)
}

// The kinds of blame for a transaction that failed in the inbox's own
// work after handlers ran in it.
const (
	// notHandlers: the database is down or restarted: retried, not
	// counted.
	notHandlers = iota
	// handlersFault: counted as the failure of the handler that caused
	// it (found by handling the batch's records one per transaction).
	handlersFault
	// sessionCut: the session ended, neither a restart nor a timeout the
	// handlers outlived explains it: pg_terminate_backend (an operator's,
	// or the handler's own on its backend: the two look the same), a
	// proxy, the network. Retried, not counted, up to maxCuts in a row.
	sessionCut
)

// maxCuts bounds the retries of a record whose session ends while its
// handler runs, for no cause that can be seen (sessionCut): a handler
// that ends its own backend is dead-lettered after as many runs, and an
// operator would have to end the same record's session that many times.
const maxCuts = 10

// blame says whose doing err is, the failure of a transaction in the
// inbox's own work after handlers ran in it, and why:
//   - not the connection's (a deferred constraint or a serialization
//     failure at the commit, a transaction a handler left aborted or
//     whose savepoint it released): the handlers';
//   - the connection's, and the database does not answer another
//     connection, or the server restarted since this worker last looked
//     (pg_postmaster_start_time changed; each worker keeps its own, so
//     every worker whose session one restart ended sees it): not the
//     handlers'. A worker that ran through a restart without a failure
//     takes its next failure of the connection for that restart, once
//     (retried, not counted);
//   - the server ended the session on idle_in_transaction_session_timeout
//     or transaction_timeout (SQLSTATE 25P03, 25P04), or a handler ran at
//     least idle_in_transaction_session_timeout, or the transaction lasted
//     at least transaction_timeout (as another connection of the pool
//     reads them): the handlers';
//   - else a cut from outside as far as can be seen (sessionCut).
func (w *worker) blame(err error) (int, string) {
	if !connectionTrouble(err) {
		return handlersFault, "the transaction itself failed: a deferred constraint or a serialization failure at the commit, or a transaction left aborted"
	}
	txAge := time.Since(w.txStart)
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	var started time.Time
	var idle, total int64
	if err := w.c.cfg.Postgres.QueryRow(ctx, `SELECT pg_postmaster_start_time(),
		coalesce((SELECT setting::int8 FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'), 0),
		coalesce((SELECT setting::int8 FROM pg_settings WHERE name = 'transaction_timeout'), 0)`).Scan(&started, &idle, &total); err != nil {
		return notHandlers, "the database does not answer"
	}
	// Each worker compares with the start time it last saw itself (when
	// created, the consumer's): one restart ends every worker's session,
	// and each must see it, not only the first to look.
	prev := w.pgStarted
	w.pgStarted = started
	w.c.serverStarted(started)
	if !prev.IsZero() && !prev.Equal(started) {
		return notHandlers, "the server restarted"
	}
	code := sqlState(err)
	if code == "" || strings.HasPrefix(code, "08") {
		code = w.handlerState
	}
	switch {
	case code == "25P03":
		return handlersFault, "the server ended its session on idle_in_transaction_session_timeout"
	case code == "25P04":
		return handlersFault, "the server ended its session on transaction_timeout"
	case idle > 0 && w.longestRun >= time.Duration(idle)*time.Millisecond:
		return handlersFault, fmt.Sprintf("a handler ran %s, at least idle_in_transaction_session_timeout (%dms)", w.longestRun.Round(time.Millisecond), idle)
	case total > 0 && txAge >= time.Duration(total)*time.Millisecond:
		return handlersFault, fmt.Sprintf("the transaction lasted %s, at least transaction_timeout (%dms)", txAge.Round(time.Millisecond), total)
	}
	return sessionCut, "the session ended from outside, as far as can be seen"
}

// sqlState is the SQLSTATE of the first *pgconn.PgError in err's tree,
// "" if none.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// claim claims id of topic for the consumer in tx, after a savepoint that undoes
// the claim with the record's changes if its handler fails; release
// releases the previous record's savepoint first. One round trip.
func (w *worker) claim(ctx context.Context, tx pgx.Tx, topic, id string, release bool) (bool, error) {
	b := &pgx.Batch{}
	if release {
		b.Queue("RELEASE SAVEPOINT walrelay_inbox")
	}
	b.Queue("SAVEPOINT walrelay_inbox")
	var fresh bool
	b.Queue("SELECT "+w.c.claim+"($1, $2, $3)", w.c.cfg.Consumer, topic, id).QueryRow(func(row pgx.Row) error { return row.Scan(&fresh) })
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
// refusal that retrying cannot fix (authorization) stops the consumer;
// one as too large makes the dead letter smaller (shrink). The error is
// clipped to deadletter.MaxText bytes: a handler's or a validator's may
// quote the record.
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
		kgo.RecordHeader{Key: sink.HeaderError, Value: deadletter.Clip(cause.Error(), deadletter.MaxText)},
		kgo.RecordHeader{Key: sink.HeaderAttempts, Value: []byte(strconv.Itoa(w.attempts + w.cuts))},
		kgo.RecordHeader{Key: sink.HeaderFirstFailure, Value: []byte(first.UTC().Format(time.RFC3339Nano))},
		kgo.RecordHeader{Key: sink.HeaderLastFailure, Value: []byte(now.Format(time.RFC3339Nano))},
		kgo.RecordHeader{Key: sink.HeaderTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: sink.HeaderPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
		kgo.RecordHeader{Key: sink.HeaderOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
		kgo.RecordHeader{Key: sink.HeaderConsumer, Value: []byte(c.cfg.Consumer)},
	)
	dl := &kgo.Record{Topic: c.cfg.DeadLetterTopic, Key: r.Key, Value: r.Value, Headers: h}
	id, _ := eventID(r)
	_, span := c.startSpan(w.ctx, r, id)
	c.log.Warn("dead-lettering a record", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "id", logID(r), "reason", reason, "attempts", w.attempts+w.cuts, "err", cause)
	err := w.produceDeadLetter(r, dl, len(r.Headers))
	endDeadLetterSpan(span, reason, err)
	if err != nil {
		return
	}
	w.mark(r)
	w.pop(1)
	w.attempts, w.cuts = 0, 0
	c.m.deadLettered.WithLabelValues(r.Topic, reason).Inc()
}

// produceDeadLetter produces dl, the dead letter of r whose first own
// headers are r's, retrying until the broker acknowledges it (nil), or the
// worker stops or the broker refuses it for want of authorization (which
// stops the consumer): the error then says why it was not written. One
// refused as too large goes again smaller (shrink): a refusal retried as
// it is would hold the partition for ever. The smallest is refused too
// only if the dead-letter topic takes next to nothing: that stops the
// consumer.
func (w *worker) produceDeadLetter(r *kgo.Record, dl *kgo.Record, own int) error {
	c := w.c
	var shrunk int // the times dl was made smaller
	// The dead-letter headers, which the smallest dead letter keeps.
	walrelay := append([]kgo.RecordHeader(nil), dl.Headers[own:]...)
	for try := 0; ; try++ {
		err := w.cl.ProduceSync(w.ctx, dl).FirstErr()
		if err == nil {
			return nil
		}
		switch {
		case w.ctx.Err() != nil:
			return fmt.Errorf("the consumer stopped (the dead-letter topic %s refused it: %w)", c.cfg.DeadLetterTopic, err)
		case errors.Is(err, kerr.MessageTooLarge):
			if w.shrink(r, dl, own, walrelay, &shrunk) {
				continue
			}
			err = fmt.Errorf("dead-letter a record of %s/%d at offset %d to %s: refused as too large with only its id and walrelay's headers (%d bytes): %w", r.Topic, r.Partition, r.Offset, c.cfg.DeadLetterTopic, deadletter.Size(dl), err)
			c.fail(err)
			return err
		case errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed):
			err = fmt.Errorf("dead-letter a record of %s/%d at offset %d to %s: %w", r.Topic, r.Partition, r.Offset, c.cfg.DeadLetterTopic, err)
			c.fail(err)
			return err
		}
		wait := backoff.Wait(c.cfg.RetryBackoffMin, c.cfg.RetryBackoffMax, try)
		c.log.Warn("dead-letter topic unavailable; retrying", "topic", c.cfg.DeadLetterTopic, "err", err, "retry_in", wait)
		if !w.sleep(wait) {
			return fmt.Errorf("the consumer stopped (the dead-letter topic %s refused it: %w)", c.cfg.DeadLetterTopic, err)
		}
	}
}

// shrink makes dl, the dead letter of r refused as too large, whose
// first own headers are r's and the others walrelay's, smaller, as the
// sink does its own (deadletter.Fit), a step further each time (*shrunk
// counts them): first
// without its value (sink.HeaderOmitted says its size); then without the
// key and r's headers over the producer's batch cap, the largest first
// (sink.HeaderKeyHeadersOmitted), the id cut only if it alone is over
// (sink.HeaderIDOmitted); then, for a dead-letter topic whose limit is
// below that cap, the smallest dead letter: r's id, walrelay's headers
// (the reason, the error clipped, where it came from) and the bytes left
// out; at last with the id cut to deadletter.MaxText bytes. It reports
// false when there is no step left.
func (w *worker) shrink(r *kgo.Record, dl *kgo.Record, own int, walrelay []kgo.RecordHeader, shrunk *int) bool {
	for ; ; *shrunk++ {
		var omitted, idOmitted int
		switch *shrunk {
		case 0:
			if dl.Value == nil {
				continue
			}
			dl.Headers = append(dl.Headers, kgo.RecordHeader{Key: sink.HeaderOmitted, Value: []byte(strconv.Itoa(len(dl.Value)))})
			dl.Value = nil
			*shrunk++
			return true
		case 1:
			id := -1
			for i := range own {
				if dl.Headers[i].Key == "id" {
					id = i
					break
				}
			}
			capBytes, _ := w.cl.OptValue(kgo.ProducerBatchMaxBytes).(int32)
			omitted, idOmitted = deadletter.Fit(dl, deadletter.Size(dl)-int(capBytes), func(i int) bool { return i < own }, id)
		case 2:
			// Built again from r and walrelay's headers.
			h := []kgo.RecordHeader{{Key: "id"}}
			omitted = len(r.Key)
			var id bool
			for _, x := range r.Headers {
				if x.Key == "id" && !id {
					h[0].Value, id = x.Value, true
					continue
				}
				omitted += len(x.Key) + len(x.Value)
			}
			if !id {
				h = h[:0]
			}
			h = append(h, walrelay...)
			if r.Value != nil {
				h = append(h, kgo.RecordHeader{Key: sink.HeaderOmitted, Value: []byte(strconv.Itoa(len(r.Value)))})
			}
			if omitted > 0 {
				h = append(h, kgo.RecordHeader{Key: sink.HeaderKeyHeadersOmitted, Value: []byte(strconv.Itoa(omitted))})
			}
			*dl = kgo.Record{Topic: dl.Topic, Headers: h}
			w.c.log.Warn("dead letter with only its id and walrelay's headers: the dead-letter topic refused it with its key and headers",
				"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "omitted_bytes", omitted)
			*shrunk++
			return true
		case 3:
			if len(dl.Headers) == 0 || dl.Headers[0].Key != "id" || len(dl.Headers[0].Value) <= deadletter.MaxText {
				continue
			}
			_, idOmitted = deadletter.Fit(dl, len(dl.Headers[0].Value)-deadletter.MaxText, func(int) bool { return false }, 0)
		default:
			return false
		}
		if omitted > 0 || idOmitted > 0 {
			w.c.log.Warn("dead letter without its key or headers, or with its id cut: too large for the dead-letter topic", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
				"omitted_bytes", omitted, "id_omitted_bytes", idOmitted)
			*shrunk++
			return true
		}
	}
}

// endDeadLetterSpan ends span (nil: none), the dead letter's, as
// dead-lettered for reason only if the dead letter was written (err nil);
// else in error as not dead-lettered, since the record is handled again.
func endDeadLetterSpan(span trace.Span, reason string, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, "not dead-lettered: "+validErr(err).Error())
	} else {
		span.SetAttributes(attrDeadLetter.String(reason))
		span.SetStatus(codes.Error, "dead-lettered: "+reason)
	}
	span.End()
}

// message is the Message of r, whose event id is id.
func message(r *kgo.Record, id string, attempt int) Message {
	m := Message{ID: id, Key: r.Key, Value: r.Value, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp,
		Headers: make(map[string][]byte, len(r.Headers)), Attempt: attempt}
	for _, h := range r.Headers {
		m.Headers[h.Key] = h.Value
	}
	m.Type = string(m.Headers["type"])
	return m
}
