package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/checkpoint"
	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/faultinject"
	"github.com/walrelay/walrelay/internal/textcut"
	"github.com/walrelay/walrelay/replication"
	"github.com/walrelay/walrelay/sink"
)

// pipeline decodes each message, tracks transactions in the checkpoint and
// hands events to the sink. It runs on the relay's goroutine; acks arrive
// on the sink's.
type pipeline struct {
	dec        *decoder.Decoder
	sink       Publisher
	tr         *checkpoint.Tracker
	produceCtx context.Context
	stop       context.CancelFunc
	log        *slog.Logger

	txn   *checkpoint.Txn // the open transaction
	hooks Hooks
	// prefixesLogged are the prefixes of ignored logical decoding messages
	// logged so far (once each, shortened by decoder.ShortPrefix), at most
	// maxPrefixesLogged: any role can emit under any prefix, of any length.
	// Only the receive goroutine uses it.
	prefixesLogged map[string]bool
	cur            *epoch // the publishing epoch of the session being read; set under mu by started

	// renewsFences: the source can open a session unless another process
	// streams the slot (OpenUnlessTaken) and the sink renews a fenced
	// producer at the next session (sink.Sink.Resume): a fence (wrapping
	// sink.ErrFenced) restarts the session instead of stopping the relay.
	// Set before the run.
	renewsFences bool

	mu         sync.Mutex
	err        error  // the first fatal error
	restartErr error  // a transient failure in this epoch: restart the session
	fence      error  // the fence that restarted the session, until the next opens (takeFence) or resumes (started)
	fenceWait  func() // ends a wait for the slot at a fence (cancelOnFence)
	interrupt  func() // ends the wait for the session's next change; set by started
	// refusal is the broker's refusal of the same event that ended the
	// last sessions in a row (refusal.go), zero if the last one ended
	// otherwise.
	refusal   Refusal
	stopAfter time.Duration    // Config.RefusalStopAfter; zero: persistentSpan
	now       func() time.Time // time.Now; a test's clock
	// hasFailure is set while err or restartErr is, so that the receive
	// goroutine checks one atomic per message instead of taking mu.
	hasFailure atomic.Bool
}

// epoch is what the records published during one replication session share
// with their callbacks: which epoch a failure belongs to, and where it
// failed.
type epoch struct {
	failing atomic.Bool // a publish of this session failed
	mu      sync.Mutex
	failed  map[partitionOf]bool // the partitions of the failed records

	// The earliest event of the session that the broker refused (a Kafka
	// error code, sink.Refused), and how; guarded by the pipeline's mu.
	refusedAt   pglogrepl.LSN
	refusedCode int16
	refusedErr  error
}

type partitionOf struct {
	topic     string
	partition int32
}

// failedOn records a failed publish on d's partition.
func (s *epoch) failedOn(d sink.Delivery) {
	s.mu.Lock()
	s.failed[partitionOf{d.Topic, d.Partition}] = true
	s.mu.Unlock()
	s.failing.Store(true)
}

// overtook reports whether an acknowledged record of d's partition came
// after one that failed in this session. The client answers a partition's
// records in order, and the sink sends nothing after a failure until the
// failed record is resent (sink.Abort), so this must not happen: it would be
// a record written ahead of the failed one. It is checked, and counted, so
// that a break of that guarantee is seen rather than assumed away.
func (s *epoch) overtook(d sink.Delivery) bool {
	if !s.failing.Load() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed[partitionOf{d.Topic, d.Partition}]
}

// fenced restarts the session after the broker refused the producer as
// fenced (err wraps sink.ErrFenced). The next session is opened only if no
// other process streams the slot (Relay.open): else another instance
// really took over, and the relay stops with err.
func (p *pipeline) fenced(s *epoch, err error, at pglogrepl.LSN) {
	p.mu.Lock()
	if s == p.cur && p.fence == nil {
		p.fence = err
		if p.fenceWait != nil {
			p.fenceWait()
		}
	}
	p.mu.Unlock()
	p.restart(s, err, at)
}

// cancelOnFence has a fence (fenced) call cancel until the returned stop
// is called, and calls it at once if a fence is recorded already: the
// relay's wait for the slot (Relay.open) ends, so that the slot tells
// whether the fence was another instance's.
func (p *pipeline) cancelOnFence(cancel func()) (stop func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fence != nil {
		cancel()
	}
	p.fenceWait = cancel
	return func() {
		p.mu.Lock()
		p.fenceWait = nil
		p.mu.Unlock()
	}
}

// takeFence returns the fence that restarted the session, if any, and
// forgets it.
func (p *pipeline) takeFence() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.fence
	p.fence = nil
	return err
}

// fail stops the relay with err, which is marked fatal; the first error
// wins.
func (p *pipeline) fail(err error) {
	err = failure.Mark(failure.Fatal, err)
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.hasFailure.Store(true)
	if p.interrupt != nil {
		p.interrupt()
	}
	p.mu.Unlock()
	p.stop()
}

func (p *pipeline) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// restart asks for the stream to start again: an event of s (at WAL
// position at) could not be delivered, and the server resends it, and all
// after it, in order. A failure from an earlier session is already being
// resent. It also notes the session's earliest event the broker refused
// (started judges whether the refusal repeats).
func (p *pipeline) restart(s *epoch, err error, at pglogrepl.LSN) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s != p.cur {
		return
	}
	var ke *kerr.Error
	if sink.Refused(err) && errors.As(err, &ke) && (s.refusedAt == 0 || at < s.refusedAt) {
		s.refusedAt, s.refusedCode, s.refusedErr = at, ke.Code, err
	}
	if p.restartErr == nil {
		p.restartErr = err
		p.hasFailure.Store(true)
		if p.interrupt != nil {
			p.interrupt()
		}
	}
}

// failureNow returns the failure that ends the session, if any: a fatal one
// stops the relay, another restarts the session.
func (p *pipeline) failureNow() (err error, fatal bool) {
	if !p.hasFailure.Load() {
		return nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.err, true
	}
	return p.restartErr, false
}

// started resets per-session state for sess: the server resends
// everything after sess.From(). If the last session failed to publish, the
// sink sends nothing more of it and answers what it sent (sink.Abort) before
// the failed record is resent; and a refusal that repeats session after
// session is fatal. interrupt ends the wait for the session's next change.
func (p *pipeline) started(ctx context.Context, sess session, interrupt func()) error {
	p.mu.Lock()
	failed := p.restartErr != nil
	p.mu.Unlock()
	resumed := false
	if t, ok := p.sink.(transactional); ok && t.Transactional() {
		// The session holds the slot: the sink may fence an earlier
		// instance, and ends its open transaction at every later session
		// (sink.Sink.Resume).
		if err := t.Resume(ctx, sess.History()); err != nil {
			if errors.Is(err, sink.ErrFenced) && !failure.IsFatal(err) && p.renewsFences {
				// The sink renews the producer at the next session, which
				// is opened only if no other process streams the slot.
				p.mu.Lock()
				if p.fence == nil {
					p.fence = err
				}
				p.mu.Unlock()
			}
			return fmt.Errorf("resume the kafka transactions: %w", err)
		}
		resumed = true
	} else if failed {
		if err := p.sink.Abort(ctx); err != nil {
			return fmt.Errorf("settle the failed session's records: %w", err)
		}
	}
	p.mu.Lock()
	if err := p.persistentRefusal(p.cur); err != nil {
		if p.err == nil {
			p.err = err
		}
		p.hasFailure.Store(true)
		p.mu.Unlock()
		return err
	}
	if resumed {
		// The fence is settled: this session holds the slot, and the sink
		// renewed its producer in Resume (a fence of the ended session is
		// answered by Resume's barrier, before the renewal). One recorded
		// since open took the last (the ended session's later answers), or
		// while Resume's barrier answered them, left here would be taken
		// for a fence of the new session: at its end (opened unless taken,
		// so that a healthy handover to a standby stopped this instance)
		// or at a clean stop ("answered while walrelay stopped").
		p.fence = nil
	}
	p.cur = &epoch{failed: map[partitionOf]bool{}}
	p.restartErr = nil
	p.interrupt = interrupt
	p.hasFailure.Store(p.err != nil)
	p.mu.Unlock()
	p.dec.Reset()
	p.tr.Reset(sess.From(), sess.Confirm)
	p.txn = nil
	return nil
}

// handle decodes, tracks and publishes one pgoutput message. An error is
// fatal (a message that does not decode, a transaction out of order);
// nothing is published once a failure is known (the caller checks
// failureNow), so that the resent events keep their order.
func (p *pipeline) handle(walStart pglogrepl.LSN, data []byte) error {
	msg, err := p.dec.Decode(walStart, data)
	if err != nil {
		return err
	}
	return p.handleMessage(walStart, msg)
}

// handleTooLarge is handle for a message too large to hold, of which the
// replication stream kept the head (replication.TooLarge): its event is
// dead-lettered without its payload.
func (p *pipeline) handleTooLarge(ch replication.Change, limit int64) error {
	m := decoder.TooLarge{Head: ch.Data, Size: ch.Size, Limit: limit, Cuts: make([]decoder.Cut, len(ch.Cuts))}
	for i, c := range ch.Cuts {
		m.Cuts[i] = decoder.Cut{Column: c.Column, Size: c.Size}
	}
	msg, err := p.dec.DecodeTooLarge(ch.WALStart, m)
	if err != nil {
		return err
	}
	return p.handleMessage(ch.WALStart, msg)
}

// handleMessage tracks and publishes one decoded message.
func (p *pipeline) handleMessage(walStart pglogrepl.LSN, msg decoder.Message) error {
	var err error
	switch m := msg.(type) {
	case decoder.Begin:
		p.hooks.Transaction()
		p.txn, err = p.tr.Begin(m.FinalLSN)
		return err
	case decoder.Commit:
		if p.txn == nil {
			return fmt.Errorf("commit at %s without an open transaction", m.CommitLSN)
		}
		err = p.txn.Commit(m.EndLSN)
		p.txn = nil
		return err
	case decoder.EventMessage:
		txn := p.txn
		if !m.Transactional {
			// A message outside any transaction is tracked as one of its own.
			if txn, err = p.tr.Begin(m.CommitLSN); err != nil {
				return err
			}
			txn.Add()
			if err := txn.Commit(m.CommitLSN); err != nil {
				return err
			}
		} else {
			txn.Add()
		}
		commit := m.CommitTime
		sess := p.cur
		p.sink.Publish(p.produceCtx, m.Event, func(d sink.Delivery, err error) {
			if err != nil {
				sess.failedOn(d)
				txn.Fail()
				if failure.IsFatal(err) && errors.Is(err, sink.ErrFenced) && p.renewsFences {
					p.fenced(sess, err, m.WALStart)
					return
				}
				if failure.IsFatal(err) {
					p.hooks.PublishError("fatal")
					p.fail(err)
					return
				}
				// Not counted: failed because an earlier record failed (or
				// at shutdown).
				if !errors.Is(err, sink.ErrNotSent) && !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrAborting) {
					p.hooks.PublishError("transient")
				}
				p.restart(sess, err, m.WALStart)
				return
			}
			if d.Skipped {
				// Committed by an earlier Kafka transaction (exactly-once).
				txn.Ack()
				return
			}
			if sess.overtook(d) {
				p.hooks.OrderBreak()
				p.log.Error("an event was written ahead of an earlier event of its partition that failed and is sent again: consumers may see this aggregate's events out of order",
					"id", textcut.ID(m.ID), "aggregate_id", textcut.ID(m.AggregateID), "topic", d.Topic, "partition", d.Partition)
			}
			p.hooks.Acked(m.Source, d.Topic, d.DeadLetter, commit)
			faultinject.Acked()
			txn.Ack()
		})
		return nil
	case decoder.Ignored:
		if m.Kind != "relation" && m.Kind != "type" && m.Kind != "origin" {
			p.hooks.Ignored(m.Kind)
		}
		if m.Kind == "message_foreign_prefix" || m.Kind == "message_source_off" {
			p.ignoredMessage(m, walStart)
		}
		p.log.Debug("ignored change", "kind", m.Kind, "lsn", walStart.String())
		return nil
	}
	return fmt.Errorf("decoder returned %T", msg)
}

// maxPrefixesLogged bounds the prefixes of ignored messages that are logged.
const maxPrefixesLogged = 100

// ignoredMessage logs an ignored logical decoding message the first time
// its prefix is seen (every one is counted by the Ignored hook).
func (p *pipeline) ignoredMessage(m decoder.Ignored, walStart pglogrepl.LSN) {
	// The decoder hands on a short prefix already; shortened again here so
	// that what is remembered stays bounded in bytes whatever the source.
	prefix := decoder.ShortPrefix(m.Prefix)
	if p.prefixesLogged[prefix] || len(p.prefixesLogged) > maxPrefixesLogged {
		return
	}
	if p.prefixesLogged == nil {
		p.prefixesLogged = map[string]bool{}
	}
	p.prefixesLogged[prefix] = true
	switch {
	case len(p.prefixesLogged) > maxPrefixesLogged:
		p.log.Warn("ignored logical decoding messages under more prefixes than walrelay logs: further prefixes are counted, not logged",
			"kind", m.Kind, "counted_as", `walrelay_changes_ignored_total{kind="`+m.Kind+`"}`)
	case m.Kind == "message_source_off":
		p.log.Warn("ignored a logical decoding message under outbox.message_prefix: outbox.messages is off, so messages are no events (logged once)",
			"prefix", prefix, "lsn", walStart.String())
	default:
		p.log.Info("ignored a logical decoding message under a prefix walrelay does not read (logged once per prefix)",
			"prefix", prefix, "lsn", walStart.String())
	}
}

// flush waits until every event handed to the sink is acknowledged, a fatal
// error happened, or ctx ends.
func (p *pipeline) flush(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if p.tr.InFlight() == 0 {
			return nil
		}
		if err := p.failure(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d events in flight: %w", p.tr.InFlight(), ctx.Err())
		case <-t.C:
		}
	}
}

// transactional is a Publisher that may produce in Kafka transactions
// (*sink.Sink in exactly-once mode): Resume is called at the start of
// every session, once it holds the slot, instead of Abort.
type transactional interface {
	Transactional() bool
	Resume(ctx context.Context, h event.WALHistory) error
}
