package txn

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/sink/produce"
)

// Resume is called at the start of every replication session, once the
// session holds the slot, before anything of it is published (package
// sink's Resume). The first call initialises the transactional producer,
// which fences an earlier instance of the transactional id (a zombie that
// lost the slot) and aborts its open transaction, and then reads the
// committed position; later calls end the open transaction with abort
// (package sink's Abort, which fails what the queue holds and waits for
// the flusher's barrier), so that an event the new session resends cannot
// join it twice, and one
// that a failed abort left open in the client (endClientTxn). A later
// call after the broker refused the producer as fenced renews it
// (renewClient) and does what the first call does: the session holds the
// slot, so no other instance streams it. A fence answered to what the
// first call does (after a renewal too: the renewal's own marker
// transaction may be the commit whose answer was lost) is not fatal
// either: it is recorded and returned retriable, wrapping ErrFenced
// (fencedAtStart), and the next call renews the producer. Waiting for the
// slot first keeps a standby from fencing the instance that streams.
//
// h is the database's WAL history: a committed position that is not on it
// (beyond its flushed WAL, or on an earlier timeline past that timeline's
// end: a restored database, a standby promoted without the last WAL) is
// of WAL this server never had, whose new events at the same positions
// would be skipped; that is refused (checkHistory).
//
// Resume must not run concurrently with Publish (the relay publishes on
// the goroutine that calls Resume). A later call ends the client's
// transaction (endClientTxn) on the caller's goroutine after abort's
// barrier: a record published in between could open a transaction on the
// flusher that this ends, and its events would then be answered as
// committed though it was aborted.
func (p *Producer) Resume(ctx context.Context, h event.WALHistory, abort func(context.Context) error) error {
	var fence error // answered to the last session, or to the first-session path below at the last Resume
	if p.started {
		err := p.resumeSession(ctx, abort)
		if err == nil {
			return p.checkHistory(h)
		}
		if !errors.Is(err, ErrFenced) {
			return err
		}
		fence = err
	} else {
		fence = p.fenceAtStart()
	}
	if fence != nil {
		// This session holds the slot, so no other instance streams it:
		// a new producer of the transactional id takes over, as a restart
		// would (renewClient), unless fences come too often (mayRenew).
		if err := p.mayRenew(fence); err != nil {
			return err
		}
		if err := p.renewClient(fence); err != nil {
			return err
		}
	}
	pctx, cancel := context.WithTimeout(ctx, txnStepTimeout)
	_, _, err := p.Client().ProducerID(pctx)
	cancel()
	if err != nil {
		if errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
			return failure.Mark(failure.Fatal, fmt.Errorf("initialise the transactional producer %s: %w (grant WRITE on TransactionalId %s, or set kafka.transactional_id to one this principal may use)", p.cfg.ID, err, p.cfg.ID))
		}
		if fenced(err) {
			return p.fencedAtStart(fmt.Errorf("%w: %s: initialise the transactional producer: %w", ErrFenced, p.cfg.ID, err))
		}
		err = fmt.Errorf("initialise the transactional producer %s (the broker must support transactions): %w", p.cfg.ID, err)
		return p.renewHeld(err)
	}
	if err := p.readCommitted(ctx); err != nil {
		if errors.Is(err, ErrFenced) {
			return p.fencedAtStart(err)
		}
		return err
	}
	p.mu.Lock()
	w := p.writer
	p.mu.Unlock()
	if w != p.cfg.ID && w != "" {
		// readCommitted refuses any other writer than Takeover.
		if err := p.fence(ctx, w); err != nil {
			return err
		}
		if err := p.readCommitted(ctx); err != nil {
			if errors.Is(err, ErrFenced) {
				return p.fencedAtStart(err)
			}
			return err
		}
		p.log.Warn("exactly-once: took over the committed position of another transactional id, which is fenced", "from", w, "transactional_id", p.cfg.ID, "position", p.Committed().String())
	}
	p.started = true
	return p.checkHistory(h)
}

// resumeSession is Resume after the first session: it ends the open
// transaction, and one that a failed abort left open in the client, and
// reads the committed position after a commit of unknown outcome. A fence
// answered meanwhile, or by the last transaction, is returned (wrapping
// ErrFenced): the client can do nothing more.
func (p *Producer) resumeSession(ctx context.Context, abort func(context.Context) error) error {
	if err := abort(ctx); err != nil {
		return err
	}
	p.mu.Lock()
	fencedBy, unresolved := p.fencedBy, p.unresolved
	p.mu.Unlock()
	if fencedBy != nil {
		return fencedBy
	}
	if err := p.endClientTxn(ctx); err != nil {
		return err
	}
	if unresolved {
		if err := p.readCommitted(ctx); err != nil {
			return fmt.Errorf("read the committed position after a commit of unknown outcome: %w", err)
		}
		p.mu.Lock()
		p.unresolved = false
		p.mu.Unlock()
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
func (p *Producer) fencedAtStart(err error) error {
	p.mu.Lock()
	p.fencedBy = err
	p.mu.Unlock()
	return failure.Mark(failure.Retriable, fmt.Errorf("%w (the next session renews the producer)", err))
}

// fenceAtStart returns the fence that fencedAtStart recorded, if any.
func (p *Producer) fenceAtStart() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fencedBy
}

// A fence that no lost answer explains, answered to an instance that
// holds its slot, is another producer's initialisation of the
// transactional id: an instance of this slot that took it for a moment
// (a standby, a rolling restart) and lost it again, which its records on
// the offsets topic tell (sameSlot); or one of another slot given the
// same id, which its records tell when the slots share the offsets topic
// (sharedBy). The producer is renewed at most MaxUnexplained times within
// RenewWindow, and MaxUnexplainedLong times within LongWindow, for fences
// that neither explains (mayRenew).
const (
	MaxUnexplained     = 5
	RenewWindow        = time.Minute
	MaxUnexplainedLong = 20
	LongWindow         = time.Hour
)

// mayRenew judges a fence (why) that the caller, which holds the slot, is
// about to answer with a renewal. One after a transaction's end whose
// answer was lost (endUnknown) is the broker's false fence: renewed. Any
// other is counted, until the read of the committed position that
// follows the renewal: if it finds a record of this slot that this sink
// did not write (sameSlot), another instance of the slot held it, and the
// renewal is not counted (readCommitted). Renewals that stay unexplained,
// more than MaxUnexplained within RenewWindow or more than
// MaxUnexplainedLong within LongWindow, are fatal (ErrFencedTooOften):
// an instance that initialises the id again and again though this one
// holds the slot, and never writes to this slot's offsets topic, is most
// likely of another slot with an offsets topic of its own given the same
// kafka.transactional_id, each renewal of either fencing the other
// without end; or the slot changes hands too often.
func (p *Producer) mayRenew(why error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.endUnknown {
		return nil
	}
	now := time.Now()
	recent := p.unexplained[:0]
	inWindow := 0
	for _, at := range p.unexplained {
		if now.Sub(at) < LongWindow {
			recent = append(recent, at)
			if now.Sub(at) < RenewWindow {
				inWindow++
			}
		}
	}
	p.unexplained = append(recent, now)
	p.pending++
	n, window := inWindow+1, RenewWindow
	if n <= MaxUnexplained {
		if n, window = len(p.unexplained), LongWindow; n <= MaxUnexplainedLong {
			return nil
		}
	}
	return failure.Mark(failure.Fatal, fmt.Errorf("%w: the producer of transactional id %s was refused as fenced %d times within %s, though this instance held its slot (%s) each time, "+
		"no lost answer of the broker explains it, and the offsets topic %s shows no other instance of the slot: if these are instances of this slot (standbys, restarts), "+
		"the slot changes hands too often (a flapping network between them and PostgreSQL); if a slot with an offsets topic of its own uses the same id (a shared configuration template), "+
		"give each slot a kafka.transactional_id of its own (empty: the default, which names the slot): %w",
		ErrFencedTooOften, p.cfg.ID, n, window, p.cfg.Key, p.cfg.OffsetsTopic, why))
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
func (p *Producer) renewClient(why error) error {
	p.log.Warn("exactly-once: the broker refused the producer as fenced, but this instance holds the replication slot, so no other instance streams it: "+
		"a new producer of the transactional id takes over (it fences any other) and the committed position is read again", "transactional_id", p.cfg.ID, "err", why)
	if err := p.replaceClient(); err != nil {
		return failure.Mark(failure.Fatal, fmt.Errorf("create a new kafka producer for transactional id %s after a fence: %w", p.cfg.ID, err))
	}
	p.mu.Lock()
	p.fencedBy = nil
	p.renewals++
	p.mu.Unlock()
	return nil
}

// renewHeld returns err, the producer id's initialisation refused, after
// replacing the client if the refusal is one a healthy cluster answers with
// for a while (produce.Held) that the client keeps as final: kgo keeps an
// InitProducerID answer that Kafka does not call retriable
// (UNKNOWN_SERVER_ERROR) for the client's life, so that every later
// transaction would fail with it. The next Resume initialises the new
// client's producer as a first one does. err stays retriable.
func (p *Producer) renewHeld(err error) error {
	if !produce.Held(err) || kerr.IsRetriable(err) || errors.Is(err, kerr.ConcurrentTransactions) {
		return err
	}
	p.log.Warn("exactly-once: the broker refused to initialise the producer with an error a broker answers while it recovers; a new producer of the transactional id asks again at the next session",
		"transactional_id", p.cfg.ID, "err", err)
	if nerr := p.replaceClient(); nerr != nil {
		return failure.Mark(failure.Fatal, fmt.Errorf("create a new kafka producer for transactional id %s after %w: %w", p.cfg.ID, err, nerr))
	}
	return err
}

// replaceClient closes the client and makes a new one of the same options:
// its producer is initialised at the next Resume, as a first one is, and a
// commit of unknown outcome is read back then. The hooks see neither the
// close nor the creation (announce): their metrics go on across it.
func (p *Producer) replaceClient() error {
	p.Client().Close()
	cl, err := kgo.NewClient(p.opts...)
	if err != nil {
		return err
	}
	p.cl.Store(cl)
	p.mu.Lock()
	p.unresolved = false
	p.mu.Unlock()
	p.started = false
	return nil
}

// endClientTxn ends a transaction that the client still holds after
// abort: one whose abort the transaction coordinator did not answer (it was
// away: frozen, cut off the network, fenced by the sink, moving) is still
// open in the client, which would refuse to begin the next one ("already in
// a transaction", fatal) and stop the relay for good. The client's abort,
// asked again, re-initialises the producer id, which has the broker abort
// whatever of it is still open there. With no transaction open in the
// client it returns at once. The coordinator still away (no answer, or a
// retriable one) is retriable: the next Resume asks again, and nothing is
// produced meanwhile. A refusal of the broker's is fatal, as it was when
// the next transaction failed to begin.
func (p *Producer) endClientTxn(ctx context.Context) error {
	actx, cancel := context.WithTimeout(ctx, txnStepTimeout)
	defer cancel()
	err := p.Client().EndTransaction(actx, kgo.TryAbort)
	p.endAnswered(false, err)
	if err == nil {
		return nil
	}
	if fenced(err) {
		return failure.Mark(failure.Fatal, fmt.Errorf("%w: %s: %w", ErrFenced, p.cfg.ID, err))
	}
	err = fmt.Errorf("abort the kafka transaction that an earlier abort left open (the transaction coordinator did not answer it): %w", err)
	if ke := (*kerr.Error)(nil); errors.As(err, &ke) && !produce.Held(err) {
		return failure.Mark(failure.Fatal, err)
	}
	return p.renewHeld(err)
}

// fence initialises a producer of the transactional id id and closes it:
// the broker aborts the open transaction of id, and a producer of id still
// running is fenced (it can commit nothing more).
func (p *Producer) fence(ctx context.Context, id string) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(p.brokers...),
		kgo.ClientID(p.clientID + "-takeover"),
		kgo.TransactionalID(id),
		kgo.TransactionTimeout(p.cfg.Timeout),
	}, p.side...)...)
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
func (p *Producer) checkHistory(h event.WALHistory) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, tl := p.committed, p.onTL
	topic := p.cfg.OffsetsTopic
	if c == (event.Position{}) {
		p.timeline = h.Timeline
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
	case p.cfg.AcceptTimeline == h.Timeline:
		carried := event.Position{CommitLSN: end, Index: -1}
		p.log.Warn("exactly-once: the committed position lies past the end of its timeline; carried to the switch (kafka.accept_timeline): the events of this timeline from the switch on are published",
			"committed", c.String(), "committed_timeline", tl, "switch", end.String(), "history", h.String())
		p.committed, p.onTL = carried, h.Timeline
	default:
		return failure.Mark(failure.Fatal, fmt.Errorf("%w: the position committed to Kafka (%s, on %s, timeline %d) lies at or past the end of timeline %d at %s in the history of this server (%s): "+
			"it was promoted or restored without the WAL from %s on, so the events published from there to %s are of transactions this database does not have, "+
			"and its own transactions at those positions would be skipped. Check what the topics hold against the outbox table (walrelay reconcile --since <a time before the switch>, or --all on a table without created_at, outbox.timestamp_column or only UUIDv7 ids), "+
			"then set kafka.accept_timeline: %d to publish this server's events from %s on",
			ErrWALHistory, c, topic, tl, tl, end, h, end, c.CommitLSN, h.Timeline, end))
	}
	if p.committed.CommitLSN > h.Flushed {
		return failure.Mark(failure.Fatal, fmt.Errorf("%w: the position committed to Kafka (%s, on %s) is beyond the database's WAL (%s, %s): its WAL history went back (a restore, or a standby promoted without the last WAL), "+
			"and new events at those positions would be skipped; check what the topics hold against the outbox table, then start with a new kafka.offsets_topic", ErrWALHistory, p.committed, topic, h.Flushed, h))
	}
	p.timeline = h.Timeline
	return nil
}
