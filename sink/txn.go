package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/faultinject"
	"github.com/walrelay/walrelay/sink/produce"
	"github.com/walrelay/walrelay/sink/txn"
)

// Exactly-once production (Config.Transactions).
//
// Records go to Kafka in transactions. The flusher opens one with the first
// record of a round, and commits it at a round's end once it is Interval old
// (up to ten times that while a full round waits behind it: a catch-up) or
// holds MaxRecords events; with the events, the transaction holds a
// record of the last event's position (event.Position) on the offsets topic,
// keyed by Key. An event's Done runs only when its transaction committed, so
// the caller confirms nothing that Kafka could still abort. Until then the
// transaction's records count against the buffers (MaxBufferedRecords and
// MaxBufferedBytes) with the queued ones: Publish waits while the open
// transaction and the queue hold that many, and the transaction then
// commits at once, with what is queued, to make room (nothing more can
// join it: queue.heldFull). A catch-up's transactions are so bounded by
// the buffers, not by MaxRecords alone: with the default buffers they
// hold at most MaxBufferedRecords (5,000) events, under MaxRecords'
// default. If any record of
// a transaction fails, or the commit does, the transaction is aborted, the
// sink is broken as in at-least-once mode, and every event of the
// transaction is answered with an error; the caller resends from its
// confirmed position, and Publish answers at once, without producing, every
// event at or before the committed position: Kafka has it already.
//
// At start (Resume, once the replication session holds the slot) the
// transactional producer is initialised first, which
// fences an earlier instance of the same transactional id and aborts its
// open transaction; then the committed position is read with read_committed
// isolation up to a marker that a transaction of this instance wrote, so
// that nothing committed before it is missed. A commit whose outcome is
// unknown is resolved the same way after the abort; while the broker is
// away the sink stays broken (a retriable failure) and the next Resume
// tries again, so an outage needs no restart of the process.
//
// A fence (the broker refused the producer: PRODUCER_FENCED,
// INVALID_PRODUCER_EPOCH) fails the transaction's events fatally with
// ErrFenced, and the client can do nothing more. The caller decides by the
// slot: if another process streams it, another instance took over and the
// caller stops; if its next session holds the slot, the broker's answer was
// not another instance's doing (it follows a commit whose answer was lost),
// and Resume makes a new producer of the id (renewClient), which fences any
// other, and reads the committed position again.

// readIdleTimeout bounds how long a read of the offsets topic to its
// marker may go without a record: a large topic takes long but makes
// progress; a reader that stalls (seen on a loaded machine) or an open
// transaction of another instance that holds the topic's last stable
// offset fails the read, retriable, and the next attempt makes a new
// reader.
const readIdleTimeout = 15 * time.Second

// txnStepTimeout bounds each step of Resume that waits on the brokers
// (initialising the producer id, writing the marker): one that does not
// finish fails, retriable, and the relay tries the session again, rather
// than waiting without end.
const txnStepTimeout = 30 * time.Second

// ErrFenced stops a relay whose transactional id another instance took.
// The broker says the same (INVALID_PRODUCER_EPOCH) of a transaction it
// aborted because it outlived the transaction timeout, during an outage
// longer than that: the message names both.
var ErrFenced = errors.New("another walrelay instance took over the transactional id (fenced)")

// ErrTransactionTimedOut stops a relay whose open transaction the broker
// aborted because it outlived the transaction timeout: Kafka took longer
// than that to accept it (an outage). The broker's answer is the one a
// fence gets (INVALID_PRODUCER_EPOCH or PRODUCER_FENCED); the age of the
// transaction tells them apart. Nothing of the transaction is committed;
// a restart resumes from the committed position.
var ErrTransactionTimedOut = errors.New("the broker aborted the kafka transaction: it was open longer than the transaction timeout")

// ErrWALHistory stops a relay whose committed position is not on the
// database's WAL history (checkHistory).
var ErrWALHistory = errors.New("the committed position is not on this database's WAL history")

// ErrOtherTransactionalID stops a relay whose slot's committed position
// was written under another transactional id than its own (and not the
// one kafka.transactional_id_takeover names).
var ErrOtherTransactionalID = errors.New("the committed position belongs to another transactional id")

// ErrSharedTransactionalID stops a relay whose transactional id another
// walrelay instance, of another slot, uses too: each would fence the
// other without end (kafka.transactional_id must be unique per slot).
var ErrSharedTransactionalID = errors.New("another walrelay instance, of another slot, uses the same transactional id: each is fenced by the other (kafka.transactional_id must be unique per slot)")

// ErrFencedTooOften stops a relay whose producer was refused as fenced
// more often than mayRenew allows, though it held its slot each time, no
// lost answer of the broker explained it, and the offsets topic showed no
// other instance of the slot (nor of another slot) under the id: either
// the slot changes hands between instances of it too often, or a slot
// with an offsets topic of its own shares the transactional id.
var ErrFencedTooOften = errors.New("the producer was refused as fenced too often, with no lost answer and no other instance seen on the offsets topic")

// txns is the sink's state in exactly-once mode.
type txns struct {
	cfg Transactions

	mu        sync.Mutex
	committed event.Position // every event at or before it is in Kafka
	writer    string         // the transactional id that committed it, as read at start
	onTL      int32          // the timeline it was committed on (0: not recorded)
	timeline  int32          // the timeline of the session: that of the positions committed now
	readLast  int64          // the records of the offsets topic the last readCommitted read
	foreign   string         // the system identifier and database of a position taken over from another one (logged once)
	failed    error          // the first failure of a record of the open transaction
	held      []heldDone     // the open transaction's answers, given when it ends

	started bool // Resume initialised the producer; only the caller's goroutine reads it
	// fencedBy is the fence (wrapping ErrFenced) that the broker answered
	// the last transaction with, or Resume's first-session path
	// (fencedAtStart): the client can do nothing more, and the next Resume
	// renews it (renewClient). Guarded by mu.
	fencedBy error
	renewals int // clients renewed after a fence; only the caller's goroutine touches it
	// endUnknown: the last end of a transaction (a commit or an abort,
	// of events or of readCommitted's marker) was answered with neither
	// success nor a fence: it may have landed, and the broker then answers
	// the re-initialisation of the producer that follows as fenced (its
	// epoch moved on) though no other producer of the id ran. A renewal
	// after it is explained (mayRenew); a commit that succeeds clears it
	// (endAnswered). Guarded by mu.
	endUnknown bool
	// unexplained are the times of the renewals of the last longWindow
	// that neither a lost answer nor another instance of the slot
	// explained (mayRenew). Guarded by mu.
	unexplained []time.Time
	// pending is how many of unexplained's last renewals wait for the
	// read of the committed position that follows them: if it finds a
	// record of this slot that this sink did not write (sameSlot), they
	// are explained and dropped (readCommitted, which runs on the
	// flusher too, after a commit of unknown outcome). Guarded by mu.
	pending int
	// ownAt is the offset of this sink's latest record on the offsets
	// topic, a marker or a position (-1 before any): a record of the slot
	// past it is another instance's (sameSlot). Guarded by mu.
	ownAt int64
	// firstMarker is the offset of the first marker this sink committed
	// to the offsets topic (-1 before it): a record past it (a position,
	// another marker) was written while this sink ran (sharedBy). Guarded
	// by mu.
	firstMarker int64
	// unresolved: a commit's outcome is not known yet (the broker went
	// away before it could be read back); Resume reads it before anything
	// more is produced.
	unresolved bool

	// poisoned are the events that the broker refused on their own in a
	// transaction, which that refusal doomed; published again, each goes
	// to the dead-letter topic instead, so the next transaction commits.
	poisoned txn.Poisons

	// The flusher's own.
	cur     txn.Current // the open transaction
	commits uint64
}

type heldDone struct {
	done func(*kgo.Record, error)
	r    *kgo.Record
	err  error
}

// Committed returns the position up to which every event is in Kafka, in
// exactly-once mode (the zero position before any).
func (s *Sink) Committed() event.Position {
	if s.tx == nil {
		return event.Position{}
	}
	s.tx.mu.Lock()
	defer s.tx.mu.Unlock()
	return s.tx.committed
}

// Transactional reports whether the sink produces in transactions.
func (s *Sink) Transactional() bool { return s.tx != nil }

// alreadyCommitted reports whether e is at or before the committed
// position.
func (t *txns) alreadyCommitted(e *event.Event) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !e.Position().After(t.committed)
}

// hold returns the callback the client calls for a record of the open
// transaction: it keeps the answer until the transaction ends, and breaks
// the sink at a failure (nothing more may join a transaction that aborts).
func (s *Sink) hold(done func(*kgo.Record, error)) func(*kgo.Record, error) {
	t := s.tx
	return func(r *kgo.Record, err error) {
		t.mu.Lock()
		t.held = append(t.held, heldDone{done, r, err})
		if err != nil && t.failed == nil {
			t.failed = err
		}
		t.mu.Unlock()
		if err != nil {
			s.q.BreakOn(err)
		}
	}
}

// produceInTxn produces one record of a round in the open transaction,
// opening one first if none is.
func (s *Sink) produceInTxn(it produce.Item) {
	t := s.tx
	if !t.cur.Open() {
		if err := s.client().BeginTransaction(); err != nil {
			s.q.BreakOn(err)
			it.Done(it.R, failure.Mark(failure.Fatal, fmt.Errorf("begin a kafka transaction: %w", err)))
			return
		}
		t.cur.Begin(time.Now())
	}
	var pos *event.Position
	if it.HasPos {
		pos = &it.Pos
	}
	t.cur.Add(it.Size, pos)
	s.client().Produce(it.Ctx, it.R, s.hold(it.Done))
}

// endTxn ends the open transaction: it commits it when commit is true and
// every record of it succeeded, else it aborts it; then it gives the held
// answers. It runs on the flusher after the round's Flush.
func (s *Sink) endTxn(ctx context.Context, commit bool) {
	t := s.tx
	if !t.cur.Open() {
		return
	}
	t.cur.End()
	t.mu.Lock()
	cause := t.failed
	t.mu.Unlock()
	if !commit && cause == nil {
		cause = errors.New("aborted")
	}
	unknown := false // a commit was tried, and its outcome is not known
	if cause == nil {
		cause = s.producePosition(ctx, t.cur.Last())
	}
	if cause == nil {
		start := time.Now()
		cause = s.client().EndTransaction(ctx, kgo.TryCommit)
		if cause == nil {
			s.committedTxn(t.cur.Last(), time.Since(start))
			return
		}
		unknown = !errors.Is(cause, kerr.OperationNotAttempted)
		t.endAnswered(true, cause)
		cause = fmt.Errorf("commit the kafka transaction: %w", cause)
	}
	s.q.BreakOn(cause)
	err := s.client().EndTransaction(ctx, kgo.TryAbort)
	t.endAnswered(false, err)
	if err != nil {
		cause = errors.Join(cause, fmt.Errorf("abort the kafka transaction: %w", err))
	}
	if age := time.Since(t.cur.Began()); fenced(cause) && age >= t.cfg.Timeout {
		cause = failure.Mark(failure.Fatal, fmt.Errorf("%w (open %s, kafka.transaction_timeout %s; Kafka did not take it sooner: an outage?); nothing of it is committed, and a restart resumes (raise kafka.transaction_timeout to outlast longer outages): %w",
			ErrTransactionTimedOut, age.Round(time.Millisecond), t.cfg.Timeout, cause))
	} else if fenced(cause) {
		cause = failure.Mark(failure.Fatal, fmt.Errorf("%w: %s: %w", ErrFenced, t.cfg.ID, cause))
	} else if unknown {
		// The commit may have landed: the committed position says. While
		// the broker cannot tell, the sink stays broken and the next
		// Resume reads it again: nothing is produced until it is known.
		if err := s.readCommitted(ctx); err != nil {
			if !failure.IsFatal(err) {
				t.mu.Lock()
				t.unresolved = true
				t.mu.Unlock()
			}
			cause = errors.Join(cause, fmt.Errorf("read the committed position after a commit of unknown outcome: %w", err))
			if failure.IsFatal(err) {
				cause = failure.Mark(failure.Fatal, cause)
			}
		}
	}
	if errors.Is(cause, ErrFenced) {
		// The client can do nothing more; the next Resume renews it.
		t.mu.Lock()
		t.fencedBy = cause
		t.mu.Unlock()
	}
	s.log.Warn("kafka transaction aborted; its events are sent again", "err", cause)
	if t.cfg.OnAbort != nil {
		t.cfg.OnAbort()
	}
	s.giveHeld(cause)
}

// committedTxn records a committed transaction and gives its answers.
func (s *Sink) committedTxn(last event.Position, took time.Duration) {
	t := s.tx
	t.mu.Lock()
	if last.After(t.committed) {
		t.committed, t.writer, t.onTL = last, t.cfg.ID, t.timeline
	}
	t.commits++
	t.endUnknown = false
	t.mu.Unlock()
	if t.cfg.OnCommit != nil {
		t.cfg.OnCommit(last, took)
	}
	s.giveHeld(nil)
}

// endAnswered records the answer err to an end of a transaction (a
// commit if commit): one that is neither a success, nor a fence, nor a
// refusal before the request was sent (OPERATION_NOT_ATTEMPTED) may have
// come after the end landed, and sets endUnknown; a commit's success
// clears it.
func (t *txns) endAnswered(commit bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case err == nil:
		if commit {
			t.endUnknown = false
		}
	case !errors.Is(err, kerr.OperationNotAttempted) && !fenced(err):
		t.endUnknown = true
	}
}

// giveHeld answers the held records: with their own error, else with
// cause (nil: committed).
func (s *Sink) giveHeld(cause error) {
	t := s.tx
	t.mu.Lock()
	held := t.held
	t.held, t.failed = nil, nil
	t.mu.Unlock()
	var notSent error
	if cause != nil {
		// The cause as text only: an event aborted for another's sake
		// must not be taken for the one refused (dead-lettered, or sent
		// alone as a suspect).
		notSent = fmt.Errorf("%w: the kafka transaction was aborted: %v", ErrNotSent, cause)
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
func (s *Sink) producePosition(ctx context.Context, last event.Position) error {
	t := s.tx
	t.mu.Lock()
	tl := t.timeline
	t.mu.Unlock()
	v, err := json.Marshal(positionRecord{Slot: t.cfg.Key, Source: t.cfg.Source, CommitLSN: last.CommitLSN.String(), Index: last.Index, Timeline: tl,
		TransactionalID: t.cfg.ID, CommittedAt: time.Now().UTC().Format(time.RFC3339Nano)})
	if err != nil {
		return err
	}
	faultinject.Reached("txn_events_flushed")
	var perr error
	at := int64(-1)
	s.client().Produce(ctx, &kgo.Record{Topic: t.cfg.OffsetsTopic, Partition: 0, Key: []byte(t.cfg.Key), Value: v}, func(r *kgo.Record, err error) {
		perr = err
		if err == nil {
			at = r.Offset
		}
	})
	if err := s.client().Flush(ctx); err != nil {
		return fmt.Errorf("flush the kafka transaction: %w", err)
	}
	t.wrote(at)
	if perr != nil {
		return fmt.Errorf("produce the position to %s: %w", t.cfg.OffsetsTopic, perr)
	}
	faultinject.Reached("txn_position_flushed")
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

// wrote notes at, the offset of a record this sink produced to the offsets
// topic (-1: not answered), as its own (ownAt).
func (t *txns) wrote(at int64) {
	t.mu.Lock()
	t.ownAt = max(t.ownAt, at)
	t.mu.Unlock()
}
