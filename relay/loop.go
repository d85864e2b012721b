package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/replication"
)

// source is where the relay's changes come from: *replication.Stream is one
// (through replicationSource), and the tests script another.
type source interface {
	// Open starts a session, reconnecting with backoff while it cannot; it
	// returns ctx's error when ctx ends, or a fatal error.
	Open(ctx context.Context) (session, error)
	State() string
	ReceivedLSN() pglogrepl.LSN
	Reconnects() uint64
}

// session is one replication session (*replication.Session): the server
// streams everything after From, and History identifies its WAL when it
// started; Next yields its changes in WAL order;
// Confirm takes the positions that may be confirmed (ignored once closed);
// Close ends it, cleanly when reason is nil (a last status update).
type session interface {
	From() pglogrepl.LSN
	History() event.WALHistory
	Next(ctx context.Context) (replication.Change, error)
	Confirm(lsn pglogrepl.LSN)
	Close(reason error)
}

// replicationSource is a replication.Stream as a source.
type replicationSource struct{ *replication.Stream }

func (s replicationSource) Open(ctx context.Context) (session, error) {
	sess, err := s.Stream.Open(ctx)
	if err != nil {
		return nil, err
	}
	return sess, nil
}

// OpenUnlessTaken opens a session unless another process streams the slot
// (replication.Stream.OpenUnlessTaken).
func (s replicationSource) OpenUnlessTaken(ctx context.Context) (session, error) {
	sess, err := s.Stream.OpenUnlessTaken(ctx)
	if err != nil {
		return nil, err
	}
	return sess, nil
}

// untakenOpener is a source that can open a session unless another
// process streams the slot: it returns a *replication.SlotActiveError
// then.
type untakenOpener interface {
	OpenUnlessTaken(ctx context.Context) (session, error)
}

// open opens the next session. After the broker refused the producer as
// fenced (exactly-once), the session is opened only if no other process
// streams the slot: then no other instance can stream it, the fence was
// not its doing (the broker answers so a re-initialisation that follows a
// commit whose answer was lost), and the sink renews its producer
// (sink.Sink.Resume). If another process streams it, another instance did
// take over: the relay stops with the fence, as it always did. A fence
// answered while Open waits for the slot (the last session's transaction,
// still in flight, fenced by the instance that took the slot meanwhile)
// ends the wait and is put to the slot the same way: else this instance
// would wait as a standby and, given the slot back, renew its producer
// and fence the instance that took over.
func (r *Relay) open(ctx context.Context) (session, error) {
	fence := r.p.takeFence()
	src, ok := r.src.(untakenOpener)
	if !ok {
		return r.src.Open(ctx)
	}
	if fence == nil {
		wait, cancel := context.WithCancel(ctx)
		stop := r.p.cancelOnFence(cancel)
		sess, err := r.src.Open(wait)
		stop()
		fencedWaiting := err != nil && !failure.IsFatal(err) && wait.Err() != nil && ctx.Err() == nil
		cancel()
		if !fencedWaiting {
			return sess, err
		}
		if fence = r.p.takeFence(); fence == nil {
			return r.src.Open(ctx)
		}
	}
	r.log.Warn("exactly-once: the broker refused the producer as fenced; the slot decides: if no other process streams it, this instance goes on with a new producer", "err", fence)
	sess, err := src.OpenUnlessTaken(ctx)
	var active *replication.SlotActiveError
	if errors.As(err, &active) {
		return nil, failure.Mark(failure.Fatal, fmt.Errorf("%w (%v)", fence, err))
	}
	if err != nil && ctx.Err() != nil && !failure.IsFatal(err) {
		return nil, stoppedFenced(fence)
	}
	return sess, err
}

// stoppedFenced is the error of a relay that stops (its context ended)
// after the broker refused its producer as fenced, before a session
// opened unless another process streams the slot could tell whether
// another instance took over (Relay.open): a takeover may have happened,
// so the stop is not clean (exit 1, as at a fence elsewhere). If no other
// instance streams the slot, the next start's producer takes over (it
// fences any other).
func stoppedFenced(fence error) error {
	return failure.Mark(failure.Fatal, fmt.Errorf("%w; answered while walrelay stopped, before the slot could tell whether another instance streams it "+
		"(if none does, the next start goes on with a new producer)", fence))
}

// stream is the relay's loop: open a session, read it, and open the next
// one when it ends, until ctx ends (then it drains: nil) or a fatal error.
func (r *Relay) stream(ctx context.Context) error {
	for {
		sess, err := r.open(ctx)
		if err != nil {
			if ctx.Err() != nil && !failure.IsFatal(err) {
				return nil
			}
			return err
		}
		stop, err := r.session(ctx, sess)
		if err != nil || stop {
			return err
		}
	}
}

// session reads one session: each change is decoded, tracked and published
// (the checkpoint tells the session what it may confirm). It ends on a
// failed publish (a restart: the next session resends from the confirmed
// position), a lost connection, a fatal error (returned), or ctx (drain,
// then stop).
func (r *Relay) session(ctx context.Context, sess session) (stop bool, err error) {
	p := r.p
	// A failure interrupts the wait for the next change; so does ctx.
	read, interrupt := context.WithCancel(ctx)
	defer interrupt()
	if err := p.started(ctx, sess, interrupt); err != nil {
		sess.Close(err)
		if failure.IsFatal(err) || p.failure() != nil {
			return true, err
		}
		return ctx.Err() != nil, nil
	}
	for {
		ch, err := sess.Next(read)
		if failure, fatal := p.failureNow(); failure != nil {
			sess.Close(failure)
			if fatal {
				return true, failure
			}
			if ctx.Err() != nil {
				return true, nil // the next start resends it
			}
			return false, nil
		}
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, context.Canceled) {
				return true, r.drain(sess)
			}
			sess.Close(err)
			if failure.IsFatal(err) {
				return true, err
			}
			return ctx.Err() != nil, nil
		}
		if err := r.handle(ch); err != nil {
			sess.Close(err)
			return true, err
		}
	}
}

// handle passes one change on: a message to the pipeline, a keepalive's WAL
// end to the checkpoint (safe to confirm when nothing is in flight: every
// message before it was handled).
func (r *Relay) handle(ch replication.Change) error {
	switch ch.Kind {
	case replication.Keepalive:
		r.p.tr.AdvanceIfIdle(ch.WALEnd)
		return nil
	case replication.TooLarge:
		return r.p.handleTooLarge(ch, r.cfg.MaxMessageBytes)
	}
	return r.p.handle(ch.WALStart, ch.Data)
}

// drain ends a session on a stop: it reads on, for up to ShutdownTimeout,
// to the end of the open transaction (a stop that split a transaction would
// confirm none of it and publish its first part again on the next start),
// waits for the events in flight, and closes the session with a last status
// update. A fatal error meanwhile is returned: a stop that did not finish
// cleanly must not report success.
func (r *Relay) drain(sess session) error {
	p := r.p
	until := time.Now().Add(r.cfg.ShutdownTimeout)
	read, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	p.mu.Lock()
	p.interrupt = cancel
	p.mu.Unlock()
	for p.txn != nil {
		ch, err := sess.Next(read)
		if failure, fatal := p.failureNow(); failure != nil {
			sess.Close(failure)
			if fatal {
				return failure
			}
			return nil // the next start resends it
		}
		if err != nil {
			if read.Err() != nil {
				r.log.Warn("stopping inside a transaction: its events will be sent again on the next start")
				break
			}
			sess.Close(err)
			if failure.IsFatal(err) {
				return err
			}
			return nil
		}
		if err := r.handle(ch); err != nil {
			sess.Close(err)
			return err
		}
	}
	fctx, fcancel := context.WithDeadline(context.Background(), until.Add(time.Second))
	err := p.flush(fctx)
	fcancel()
	if failure, fatal := p.failureNow(); fatal {
		sess.Close(failure)
		return failure
	}
	// A retriable failure meanwhile: the failed transaction is not
	// confirmed, and the next start resends it; the clean close confirms
	// what was acknowledged before it.
	if err != nil {
		r.log.Warn("events still in flight at shutdown; they will be sent again on the next start", "err", err)
	}
	sess.Close(nil)
	return nil
}
