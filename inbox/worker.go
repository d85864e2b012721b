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
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/backoff"
	"github.com/walrelay/walrelay/internal/faultinject"
)

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

	// Version order (Config.VersionOrder, version.go). held are the
	// records waiting for their aggregate's earlier versions, in offset
	// order (under mu: push counts them); heldSince keeps, by offset, the
	// time a record released to the queue was first held; advanced are
	// the aggregates whose version the batch moved; finished is the
	// latest record done (mark).
	held              []heldRecord
	heldSince         map[int64]time.Time
	advanced          map[string]bool
	finished          *kgo.Record
	versionlessLogged bool
}

func newWorker(c *Consumer, cl *kgo.Client, tp topicPartition) *worker {
	ctx, cancel := context.WithCancel(context.Background())
	return &worker{c: c, cl: cl, tp: tp, wake: make(chan struct{}, 1), stopCh: make(chan struct{}), ctx: ctx, cancel: cancel, done: make(chan struct{}), isolate: -1,
		pgStarted: c.pgStarted, runs: map[int64]int{}, heldSince: map[int64]time.Time{}, advanced: map[string]bool{}}
}

// stop ends the worker after its current batch; abort also cancels the
// batch's handlers (its transaction rolls back).
func (w *worker) stop(abort bool) {
	w.stopOnce.Do(func() { close(w.stopCh) })
	if abort {
		w.cancel()
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
	defer w.dropHeld()
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
		w.release()
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
		var claimFailed *claimError
		if len(ran) > 0 && errors.As(err, &claimFailed) && !connectionTrouble(err) {
			// The claim of a record after those whose handlers ran failed:
			// its fault, not theirs. They go one per transaction, then it
			// fails its claim at the head, where it is counted.
			w.isolate = recs[ran[len(ran)-1]].Offset
			c.log.Warn("the claim of an event failed after handlers ran in its transaction; handling those records one per transaction",
				"topic", w.tp.topic, "partition", w.tp.partition, "from_offset", head.Offset, "to_offset", w.isolate, "err", err)
			continue
		}
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
			reason, msg := "handler_failed", "handler failed; retrying"
			var ce *claimError
			if errors.As(err, &ce) {
				reason, msg = "claim_failed", "the inbox's claim of the event failed; retrying"
			}
			if w.attempts >= c.cfg.MaxAttempts {
				w.deadLetter(head, reason, err)
				continue
			}
			c.m.retries.WithLabelValues(w.tp.topic).Inc()
			wait := backoff.Wait(c.cfg.RetryBackoffMin, c.cfg.RetryBackoffMax, w.attempts-1)
			c.log.Warn(msg, "topic", w.tp.topic, "partition", w.tp.partition, "offset", head.Offset, "id", logID(head),
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
	if err := c.unreadable(recs[0]); err != nil {
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
	done, handled, dups, stale := 0, 0, 0, 0
	var ahead []heldRecord // held once the batch commits
	var ran []int
	for i, r := range recs {
		if i > 0 && time.Since(start) >= c.cfg.BatchMaxTime {
			break
		}
		if c.unreadable(r) != nil {
			break // at the head of the next batch: dead-lettered
		}
		id, _ := eventID(r)
		m := message(r, id, 1)
		m.reg = c.cfg.Registry
		hctx, span := c.startSpan(ctx, r, id)
		if span != nil {
			spans = append(spans, openSpan{span, i})
		}
		fresh, err := w.claim(ctx, tx, r.Topic, m.ID, i > 0)
		if err != nil {
			return 0, ran, &claimError{fmt.Errorf("claim event %s of %s in %s: %w", clipID(m.ID), r.Topic, c.table, err)}
		}
		if !fresh {
			if span != nil {
				span.SetAttributes(attrDuplicate.Bool(true))
			}
			dups++
			done = i + 1
			continue
		}
		var ver versionCheck
		if c.cfg.VersionOrder {
			if ver, err = w.checkVersion(ctx, tx, r); err != nil {
				return 0, ran, err
			}
			switch ver.verdict {
			case versionStale: // its claim commits: handled, as nothing
				stale++
				done = i + 1
				continue
			case versionAhead: // its claim is undone: handled once released
				if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT walrelay_inbox"); err != nil {
					return 0, ran, fmt.Errorf("roll back the claim of event %s, held for its aggregate's versions: %w", m.ID, err)
				}
				ahead = append(ahead, heldRecord{r: r, got: ver.got, want: ver.want})
				done = i + 1
				continue
			}
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
				return 0, ran, fmt.Errorf("roll back event %s after its handler failed (%v): %w", clipID(m.ID), err, rerr)
			}
			failure = &handlerError{fmt.Errorf("handle event %s (%s/%d at offset %d): %w", clipID(m.ID), r.Topic, r.Partition, r.Offset, err)}
			failed = i
			break
		}
		if ver.verdict == versionNext && c.cfg.VersionOrder {
			if err := w.storeVersion(ctx, tx, r, ver.got); err != nil {
				return 0, ran, err
			}
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
	for _, h := range ahead {
		w.hold(h)
	}
	w.mark(recs[done-1])
	c.m.commits.Inc()
	c.m.handled.WithLabelValues(w.tp.topic).Add(float64(handled))
	c.m.duplicates.WithLabelValues(w.tp.topic).Add(float64(dups))
	c.m.versionStale.WithLabelValues(w.tp.topic).Add(float64(stale))
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
			w.c.log.Error("handler panicked", "id", clipID(m.ID), "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		}
		w.c.m.latency.Observe(time.Since(start).Seconds())
	}()
	return w.c.h(ctx, tx, m)
}

// mark marks r's offset for commit: every record up to it is handled,
// skipped as a duplicate or stale, or dead-lettered; but a record held
// before it (VersionOrder) holds the mark before itself (markable).
func (w *worker) mark(r *kgo.Record) {
	w.cl.MarkCommitRecords(w.markable(r))
	w.mu.Lock()
	hwm := w.hwm
	w.mu.Unlock()
	w.c.m.lag.WithLabelValues(w.tp.topic, strconv.Itoa(int(w.tp.partition))).Set(float64(max(0, hwm-r.Offset-1)))
}
