package txn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/faultinject"
	"github.com/walrelay/walrelay/sink/produce"
)

// A transaction's way through the producer, as Rounds drives it on the
// flusher: produce opens one with its first record, flush waits for the
// records' answers, end commits it with its position, or aborts it, and
// gives the answers it held.

// hold returns the callback the client calls for a record of the open
// transaction: it keeps the answer until the transaction ends, and breaks
// the sink at a failure (nothing more may join a transaction that aborts).
func (p *Producer) hold(done func(*kgo.Record, error)) func(*kgo.Record, error) {
	return func(r *kgo.Record, err error) {
		p.mu.Lock()
		p.held = append(p.held, heldDone{done, r, err})
		if err != nil && p.failed == nil {
			p.failed = err
		}
		p.mu.Unlock()
		if err != nil {
			p.q.BreakOn(err)
		}
	}
}

// produceInTxn produces one record of a round in the open transaction,
// opening one first if none is (Current.Begin); it answers the record
// itself if it cannot.
func (p *Producer) produceInTxn(it produce.Item) {
	if !p.cur.Open() {
		if err := p.Client().BeginTransaction(); err != nil {
			p.q.BreakOn(err)
			it.Done(it.R, failure.Mark(failure.Fatal, fmt.Errorf("begin a kafka transaction: %w", err)))
			return
		}
		p.cur.Begin(time.Now())
	}
	var pos *event.Position
	if it.HasPos {
		pos = &it.Pos
	}
	p.cur.Add(it.Size, pos)
	p.Client().Produce(it.Ctx, it.R, p.hold(it.Done))
}

// flush returns once every record handed to the client is answered, or
// ctx ends.
func (p *Producer) flush(ctx context.Context) { _ = p.Client().Flush(ctx) }

// endTxn ends the open transaction, if one is (Current.End): it commits it
// with its position when commit is true and every record of it succeeded,
// else it aborts it; then it gives the held answers. It runs on the
// flusher after the round's flush.
func (p *Producer) endTxn(ctx context.Context, commit bool) {
	if !p.cur.Open() {
		return
	}
	p.cur.End()
	p.mu.Lock()
	cause := p.failed
	p.mu.Unlock()
	if !commit && cause == nil {
		cause = errors.New("aborted")
	}
	unknown := false // a commit was tried, and its outcome is not known
	if cause == nil {
		cause = p.producePosition(ctx, p.cur.Last())
	}
	if cause == nil {
		start := time.Now()
		cause = p.Client().EndTransaction(ctx, kgo.TryCommit)
		if cause == nil {
			p.committedTxn(p.cur.Last(), time.Since(start))
			return
		}
		unknown = !errors.Is(cause, kerr.OperationNotAttempted)
		p.endAnswered(true, cause)
		cause = fmt.Errorf("commit the kafka transaction: %w", cause)
	}
	p.q.BreakOn(cause)
	err := p.Client().EndTransaction(ctx, kgo.TryAbort)
	p.endAnswered(false, err)
	if err != nil {
		cause = errors.Join(cause, fmt.Errorf("abort the kafka transaction: %w", err))
	}
	if age := time.Since(p.cur.Began()); fenced(cause) && age >= p.cfg.Timeout {
		cause = failure.Mark(failure.Fatal, fmt.Errorf("%w (open %s, kafka.transaction_timeout %s; Kafka did not take it sooner: an outage?); nothing of it is committed, and a restart resumes (raise kafka.transaction_timeout to outlast longer outages): %w",
			ErrTransactionTimedOut, age.Round(time.Millisecond), p.cfg.Timeout, cause))
	} else if fenced(cause) {
		cause = failure.Mark(failure.Fatal, fmt.Errorf("%w: %s: %w", ErrFenced, p.cfg.ID, cause))
	} else if unknown {
		// The commit may have landed: the committed position says. While
		// the broker cannot tell, the sink stays broken and the next
		// Resume reads it again: nothing is produced until it is known.
		if err := p.readCommitted(ctx); err != nil {
			if !failure.IsFatal(err) {
				p.mu.Lock()
				p.unresolved = true
				p.mu.Unlock()
			}
			cause = errors.Join(cause, fmt.Errorf("read the committed position after a commit of unknown outcome: %w", err))
			if failure.IsFatal(err) {
				cause = failure.Mark(failure.Fatal, cause)
			}
		}
	}
	if errors.Is(cause, ErrFenced) {
		// The client can do nothing more; the next Resume renews it.
		p.mu.Lock()
		p.fencedBy = cause
		p.mu.Unlock()
	}
	p.log.Warn("kafka transaction aborted; its events are sent again", "err", cause)
	if p.cfg.OnAbort != nil {
		p.cfg.OnAbort()
	}
	p.giveHeld(cause)
}

// committedTxn records a committed transaction and gives its answers.
func (p *Producer) committedTxn(last event.Position, took time.Duration) {
	p.mu.Lock()
	if last.After(p.committed) {
		p.committed, p.writer, p.onTL = last, p.cfg.ID, p.timeline
	}
	p.commits++
	p.endUnknown = false
	p.mu.Unlock()
	if p.cfg.OnCommit != nil {
		p.cfg.OnCommit(last, took)
	}
	p.giveHeld(nil)
}

// endAnswered records the answer err to an end of a transaction (a
// commit if commit): one that is neither a success, nor a fence, nor a
// refusal before the request was sent (OPERATION_NOT_ATTEMPTED) may have
// come after the end landed, and sets endUnknown; a commit's success
// clears it.
func (p *Producer) endAnswered(commit bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err == nil:
		if commit {
			p.endUnknown = false
		}
	case !errors.Is(err, kerr.OperationNotAttempted) && !fenced(err):
		p.endUnknown = true
	}
}

// giveHeld answers the held records: with their own error, else with
// cause (nil: committed).
func (p *Producer) giveHeld(cause error) {
	p.mu.Lock()
	held := p.held
	p.held, p.failed = nil, nil
	p.mu.Unlock()
	var notSent error
	if cause != nil {
		// The cause as text only: an event aborted for another's sake
		// must not be taken for the one refused (dead-lettered, or sent
		// alone as a suspect).
		notSent = fmt.Errorf("%w: the kafka transaction was aborted: %v", produce.ErrNotSent, cause)
		if failure.IsFatal(cause) {
			notSent = failure.Mark(failure.Fatal, notSent)
		}
	}
	for _, h := range held {
		err := h.err
		switch {
		case cause != nil && failure.IsFatal(cause):
			err = cause // fenced, say: each event says so
		case err == nil:
			err = notSent
		}
		h.done(h.r, err)
	}
}

// fenced reports whether err says that another producer took the
// transactional id. INVALID_TXN_STATE is one such answer: to the end of a
// transaction that another producer's initialisation aborted meanwhile
// (KIP-890 takes the end for a retry of the abort), or to a produce into
// it; franz-go then fails the producer id for good (every later
// initialisation of the client is refused so), and only a new producer
// goes on, as after a fence.
func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.InvalidTxnState) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed)
}

// producePosition produces the position record of the open transaction and
// flushes, so that every record of it is answered.
func (p *Producer) producePosition(ctx context.Context, last event.Position) error {
	p.mu.Lock()
	tl := p.timeline
	p.mu.Unlock()
	v, err := json.Marshal(positionRecord{Slot: p.cfg.Key, Source: p.cfg.Source, CommitLSN: last.CommitLSN.String(), Index: last.Index, Timeline: tl,
		TransactionalID: p.cfg.ID, CommittedAt: time.Now().UTC().Format(time.RFC3339Nano)})
	if err != nil {
		return err
	}
	faultinject.Reached("txn_events_flushed")
	var perr error
	at := int64(-1)
	p.Client().Produce(ctx, &kgo.Record{Topic: p.cfg.OffsetsTopic, Partition: 0, Key: []byte(p.cfg.Key), Value: v}, func(r *kgo.Record, err error) {
		perr = err
		if err == nil {
			at = r.Offset
		}
	})
	if err := p.Client().Flush(ctx); err != nil {
		return fmt.Errorf("flush the kafka transaction: %w", err)
	}
	p.wrote(at)
	if perr != nil {
		return fmt.Errorf("produce the position to %s: %w", p.cfg.OffsetsTopic, perr)
	}
	faultinject.Reached("txn_position_flushed")
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// wrote notes at, the offset of a record this sink produced to the offsets
// topic (-1: not answered), as its own (ownAt).
func (p *Producer) wrote(at int64) {
	p.mu.Lock()
	p.ownAt = max(p.ownAt, at)
	p.mu.Unlock()
}
