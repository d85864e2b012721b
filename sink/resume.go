package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
)

// Resume is called at the start of every replication session, once the
// session holds the slot, before anything of it is published. In
// exactly-once mode the first call initialises the transactional producer,
// which fences an earlier instance of the transactional id (a zombie that
// lost the slot) and aborts its open transaction, and then reads the
// committed position; later calls end the open transaction as Abort does,
// so that an event the new session resends cannot join it twice, and one
// that a failed abort left open in the client (endClientTxn). A later
// call after the broker refused the producer as fenced renews it
// (renewClient) and does what the first call does: the session holds the
// slot, so no other instance streams it. A fence answered to what the
// first call does (after a renewal too: the renewal's own marker
// transaction may be the commit whose answer was lost) is not fatal
// either: it is recorded and returned retriable, wrapping ErrFenced
// (fencedAtStart), and the next call renews the producer. In
// at-least-once mode it does
// nothing. Waiting for the slot first keeps a
// standby from fencing the instance that streams.
//
// h is the database's WAL history: a committed position that is not on it
// (beyond its flushed WAL, or on an earlier timeline past that timeline's
// end: a restored database, a standby promoted without the last WAL) is
// of WAL this server never had, whose new events at the same positions
// would be skipped; that is refused (checkHistory).
//
// Resume must not run concurrently with Publish (the relay publishes on
// the goroutine that calls Resume). A later call ends the client's
// transaction (endClientTxn) on the caller's goroutine after Abort's
// barrier: a record published in between could open a transaction on the
// flusher that this ends, and its events would then be answered as
// committed though it was aborted.
func (s *Sink) Resume(ctx context.Context, h event.WALHistory) error {
	t := s.tx
	if t == nil {
		return nil
	}
	var fence error // answered to the last session, or to the first-session path below at the last Resume
	if t.started {
		err := s.resumeSession(ctx)
		if err == nil {
			return s.checkHistory(h)
		}
		if !errors.Is(err, ErrFenced) {
			return err
		}
		fence = err
	} else {
		fence = s.fenceAtStart()
	}
	if fence != nil {
		// This session holds the slot, so no other instance streams it:
		// a new producer of the transactional id takes over, as a restart
		// would (renewClient), unless fences come too often (mayRenew).
		if err := s.mayRenew(fence); err != nil {
			return err
		}
		if err := s.renewClient(fence); err != nil {
			return err
		}
	}
	pctx, cancel := context.WithTimeout(ctx, txnStepTimeout)
	_, _, err := s.client().ProducerID(pctx)
	cancel()
	if err != nil {
		if errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
			return failure.Mark(failure.Fatal, fmt.Errorf("initialise the transactional producer %s: %w (grant WRITE on TransactionalId %s, or set kafka.transactional_id to one this principal may use)", t.cfg.ID, err, t.cfg.ID))
		}
		if fenced(err) {
			return s.fencedAtStart(fmt.Errorf("%w: %s: initialise the transactional producer: %w", ErrFenced, t.cfg.ID, err))
		}
		err = fmt.Errorf("initialise the transactional producer %s (the broker must support transactions): %w", t.cfg.ID, err)
		return s.renewHeld(err)
	}
	if err := s.readCommitted(ctx); err != nil {
		if errors.Is(err, ErrFenced) {
			return s.fencedAtStart(err)
		}
		return err
	}
	t.mu.Lock()
	w := t.writer
	t.mu.Unlock()
	if w != t.cfg.ID && w != "" {
		// readCommitted refuses any other writer than Takeover.
		if err := s.fence(ctx, w); err != nil {
			return err
		}
		if err := s.readCommitted(ctx); err != nil {
			if errors.Is(err, ErrFenced) {
				return s.fencedAtStart(err)
			}
			return err
		}
		s.log.Warn("exactly-once: took over the committed position of another transactional id, which is fenced", "from", w, "transactional_id", t.cfg.ID, "position", s.Committed().String())
	}
	t.started = true
	return s.checkHistory(h)
}

// resumeSession is Resume after the first session: it ends the open
// transaction, and one that a failed abort left open in the client, and
// reads the committed position after a commit of unknown outcome. A fence
// answered meanwhile, or by the last transaction, is returned (wrapping
// ErrFenced): the client can do nothing more.
func (s *Sink) resumeSession(ctx context.Context) error {
	t := s.tx
	if err := s.Abort(ctx); err != nil {
		return err
	}
	t.mu.Lock()
	fencedBy, unresolved := t.fencedBy, t.unresolved
	t.mu.Unlock()
	if fencedBy != nil {
		return fencedBy
	}
	if err := s.endClientTxn(ctx); err != nil {
		return err
	}
	if unresolved {
		if err := s.readCommitted(ctx); err != nil {
			return fmt.Errorf("read the committed position after a commit of unknown outcome: %w", err)
		}
		t.mu.Lock()
		t.unresolved = false
		t.mu.Unlock()
	}
	return nil
}

// fencedAtStart records a fence (wrapping ErrFenced) answered to Resume's
// first-session path (the producer's initialisation, or the marker
// transaction of readCommitted), after a renewal as at the first session:
// the broker gives it after a commit whose answer was lost, the renewal's
// own marker's included. The caller holds the slot, as at a fence answered
// to resumeSession, so it is not fatal: the returned error, retriable,
// ends the session, and the next Resume renews the producer
// (renewClient). It wraps ErrFenced, so that the relay opens the next
// session only if no other process streams the slot.
func (s *Sink) fencedAtStart(err error) error {
	t := s.tx
	t.mu.Lock()
	t.fencedBy = err
	t.mu.Unlock()
	return failure.Mark(failure.Retriable, fmt.Errorf("%w (the next session renews the producer)", err))
}

// fenceAtStart returns the fence that fencedAtStart recorded, if any.
func (s *Sink) fenceAtStart() error {
	t := s.tx
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fencedBy
}

// A fence that no lost answer explains, answered to an instance that
// holds its slot, is another producer's initialisation of the
// transactional id: an instance of this slot that took it for a moment
// (a standby, a rolling restart) and lost it again, which its records on
// the offsets topic tell (sameSlot); or one of another slot given the
// same id, which its records tell when the slots share the offsets topic
// (sharedBy). The producer is renewed at most maxUnexplained times within
// renewWindow, and maxUnexplainedLong times within longWindow, for fences
// that neither explains (mayRenew).
const (
	maxUnexplained     = 5
	renewWindow        = time.Minute
	maxUnexplainedLong = 20
	longWindow         = time.Hour
)

// mayRenew judges a fence (why) that the caller, which holds the slot, is
// about to answer with a renewal. One after a transaction's end whose
// answer was lost (endUnknown) is the broker's false fence: renewed. Any
// other is counted, until the read of the committed position that
// follows the renewal: if it finds a record of this slot that this sink
// did not write (sameSlot), another instance of the slot held it, and the
// renewal is not counted (readCommitted). Renewals that stay unexplained,
// more than maxUnexplained within renewWindow or more than
// maxUnexplainedLong within longWindow, are fatal (ErrFencedTooOften):
// an instance that initialises the id again and again though this one
// holds the slot, and never writes to this slot's offsets topic, is most
// likely of another slot with an offsets topic of its own given the same
// kafka.transactional_id, each renewal of either fencing the other
// without end; or the slot changes hands too often.
func (s *Sink) mayRenew(why error) error {
	t := s.tx
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.endUnknown {
		return nil
	}
	now := time.Now()
	recent := t.unexplained[:0]
	inWindow := 0
	for _, at := range t.unexplained {
		if now.Sub(at) < longWindow {
			recent = append(recent, at)
			if now.Sub(at) < renewWindow {
				inWindow++
			}
		}
	}
	t.unexplained = append(recent, now)
	t.pending++
	n, window := inWindow+1, renewWindow
	if n <= maxUnexplained {
		if n, window = len(t.unexplained), longWindow; n <= maxUnexplainedLong {
			return nil
		}
	}
	return failure.Mark(failure.Fatal, fmt.Errorf("%w: the producer of transactional id %s was refused as fenced %d times within %s, though this instance held its slot (%s) each time, "+
		"no lost answer of the broker explains it, and the offsets topic %s shows no other instance of the slot: if these are instances of this slot (standbys, restarts), "+
		"the slot changes hands too often (a flapping network between them and PostgreSQL); if a slot with an offsets topic of its own uses the same id (a shared configuration template), "+
		"give each slot a kafka.transactional_id of its own (empty: the default, which names the slot): %w",
		ErrFencedTooOften, t.cfg.ID, n, window, t.cfg.Key, t.cfg.OffsetsTopic, why))
}

// renewClient replaces the producer after the broker answered it as
// fenced (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE:
// fenced), which the client never
// recovers from. Resume calls it once the session holds the slot: no other
// instance can stream the slot then, so the answer was not another
// instance's doing, or that instance has lost the slot since. The broker
// gives it after a commit whose answer a network cut lost: the producer's
// re-initialisation that follows is refused, though no other producer of
// the id ran. The new producer of the same transactional id bumps its
// epoch, which fences any other producer of it and aborts its open
// transaction; then Resume reads the committed position again with
// read_committed, as at a restart. Nothing is produced in between. why is
// the fence.
func (s *Sink) renewClient(why error) error {
	t := s.tx
	s.log.Warn("exactly-once: the broker refused the producer as fenced, but this instance holds the replication slot, so no other instance streams it: "+
		"a new producer of the transactional id takes over (it fences any other) and the committed position is read again", "transactional_id", t.cfg.ID, "err", why)
	// The hooks see neither the close nor the creation (announceClient):
	// their metrics go on across the renewal.
	s.client().Close()
	cl, err := kgo.NewClient(s.clOpts...)
	if err != nil {
		return failure.Mark(failure.Fatal, fmt.Errorf("create a new kafka producer for transactional id %s after a fence: %w", t.cfg.ID, err))
	}
	s.cl.Store(cl)
	t.mu.Lock()
	t.fencedBy, t.unresolved = nil, false
	t.mu.Unlock()
	t.started = false
	t.renewals++
	return nil
}

// endClientTxn ends a transaction that the client still holds after
// Abort: one whose abort the transaction coordinator did not answer (it was
// away: frozen, cut off the network, fenced by the sink, moving) is still
// open in the client, which would refuse to begin the next one ("already in
// a transaction", fatal) and stop the relay for good. The client's abort,
// asked again, re-initialises the producer id, which has the broker abort
// whatever of it is still open there. With no transaction open in the
// client it returns at once. The coordinator still away (no answer, or a
// retriable one) is retriable: the next Resume asks again, and nothing is
// produced meanwhile. A refusal of the broker's is fatal, as it was when
// the next transaction failed to begin.
func (s *Sink) endClientTxn(ctx context.Context) error {
	t := s.tx
	actx, cancel := context.WithTimeout(ctx, txnStepTimeout)
	defer cancel()
	err := s.client().EndTransaction(actx, kgo.TryAbort)
	t.endAnswered(false, err)
	if err == nil {
		return nil
	}
	if fenced(err) {
		return failure.Mark(failure.Fatal, fmt.Errorf("%w: %s: %w", ErrFenced, t.cfg.ID, err))
	}
	err = fmt.Errorf("abort the kafka transaction that an earlier abort left open (the transaction coordinator did not answer it): %w", err)
	if ke := (*kerr.Error)(nil); errors.As(err, &ke) && !Held(err) {
		return failure.Mark(failure.Fatal, err)
	}
	return s.renewHeld(err)
}

// fence initialises a producer of the transactional id id and closes it:
// the broker aborts the open transaction of id, and a producer of id still
// running is fenced (it can commit nothing more).
func (s *Sink) fence(ctx context.Context, id string) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(s.cfg.Brokers...),
		kgo.ClientID(s.cfg.ClientID + "-takeover"),
		kgo.TransactionalID(id),
		kgo.TransactionTimeout(s.tx.cfg.Timeout),
	}, s.clientOpts()...)...)
	if err != nil {
		return fmt.Errorf("create a producer to fence transactional id %s: %w", id, err)
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, txnStepTimeout)
	defer cancel()
	if _, _, err := cl.ProducerID(pctx); err != nil {
		if errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
			return failure.Mark(failure.Fatal, fmt.Errorf("fence transactional id %s (kafka.transactional_id_takeover): %w (grant WRITE on TransactionalId %s)", id, err, id))
		}
		return fmt.Errorf("fence transactional id %s (kafka.transactional_id_takeover): %w", id, err)
	}
	return nil
}

// checkHistory refuses a committed position that is not on the server's
// WAL history h: one on a later timeline than the server's, or on an
// earlier one that is not in its history or that the server's history left
// at or before the position (the same LSNs then hold other transactions),
// or one beyond the server's flushed WAL. A position on an earlier timeline
// past its end is carried to the switch when AcceptTimeline names h's
// timeline. From here on, positions are committed on h's timeline.
func (s *Sink) checkHistory(h event.WALHistory) error {
	t := s.tx
	t.mu.Lock()
	defer t.mu.Unlock()
	c, tl := t.committed, t.onTL
	topic := t.cfg.OffsetsTopic
	if c == (event.Position{}) {
		t.timeline = h.Timeline
		return nil
	}
	end, inHistory := h.Ends[tl]
	switch {
	case tl == 0 || tl == h.Timeline:
	case tl > h.Timeline || !inHistory:
		return failure.Mark(failure.Fatal, fmt.Errorf("%w: the position committed to Kafka (%s, on %s) was committed on timeline %d, which is not in the history of this server (%s): "+
			"a restore, or a standby of another history; new events at those positions would be skipped. "+
			"Check what the topics hold against the outbox table (walrelay reconcile), then start with a new kafka.offsets_topic", ErrWALHistory, c, topic, tl, h))
	case c.CommitLSN < end:
		// On WAL both timelines share.
	case t.cfg.AcceptTimeline == h.Timeline:
		carried := event.Position{CommitLSN: end, Index: -1}
		s.log.Warn("exactly-once: the committed position lies past the end of its timeline; carried to the switch (kafka.accept_timeline): the events of this timeline from the switch on are published",
			"committed", c.String(), "committed_timeline", tl, "switch", end.String(), "history", h.String())
		t.committed, t.onTL = carried, h.Timeline
	default:
		return failure.Mark(failure.Fatal, fmt.Errorf("%w: the position committed to Kafka (%s, on %s, timeline %d) lies at or past the end of timeline %d at %s in the history of this server (%s): "+
			"it was promoted or restored without the WAL from %s on, so the events published from there to %s are of transactions this database does not have, "+
			"and its own transactions at those positions would be skipped. Check what the topics hold against the outbox table (walrelay reconcile --since <a time before the switch>, or --all on a table without created_at, outbox.timestamp_column or only UUIDv7 ids), "+
			"then set kafka.accept_timeline: %d to publish this server's events from %s on",
			ErrWALHistory, c, topic, tl, tl, end, h, end, c.CommitLSN, h.Timeline, end))
	}
	if t.committed.CommitLSN > h.Flushed {
		return failure.Mark(failure.Fatal, fmt.Errorf("%w: the position committed to Kafka (%s, on %s) is beyond the database's WAL (%s, %s): its WAL history went back (a restore, or a standby promoted without the last WAL), "+
			"and new events at those positions would be skipped; check what the topics hold against the outbox table, then start with a new kafka.offsets_topic", ErrWALHistory, t.committed, topic, h.Flushed, h))
	}
	t.timeline = h.Timeline
	return nil
}
