package relay

import (
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/sink"
)

// maxPersistent is how many sessions in a row must end on the same
// persistent refusal (sink.Persistent) of the same event, over at least
// persistentSpan, before the relay stops.
const maxPersistent = 5

// persistentSpan is the least time from the first of those sessions
// (Config.RefusalStopAfter's default): a
// count alone is filled by a hiccup in a second or two (the reconnect
// backoff starts at 100 ms). Two minutes is Kafka's own measure of how long
// a producer keeps trying a record (the Java producer's delivery.timeout.ms
// default, 120 s), well past a broker's restart or a leader's election
// (seconds to tens of seconds), and short enough that a refusal that needs
// a fix (a topic's policy, a codec the broker refuses) is reported within
// minutes. The events are held meanwhile, and the slot before them.
const persistentSpan = 2 * time.Minute

// refusalLogEvery is how often a refusal that goes on is logged again, and
// the least time between two lines of a refusal whose code changes.
const refusalLogEvery = time.Minute

// Refusal is the broker's refusal of an event that the relay holds and
// retries: the earliest event refused in each of the last sessions in a
// row, with the same code.
type Refusal struct {
	// At is the refused event's WAL position.
	At pglogrepl.LSN
	// Code is Kafka's name of the error, as UNKNOWN_SERVER_ERROR.
	Code string
	// Err is the error's text.
	Err string
	// Since is when the first of the sessions ended on it.
	Since time.Time
	// Sessions is how many sessions in a row ended on it.
	Sessions int
	// Persistent is set for a code that no healthy cluster answers with
	// for long (sink.Persistent): the relay stops once maxPersistent
	// sessions over persistentSpan ended on it. Any other is held for as
	// long as it lasts.
	Persistent bool
	// StopsAfter says, for people, when a persistent refusal stops the
	// relay; empty for another.
	StopsAfter string

	code   int16
	logged time.Time
}

// Refusal returns the broker's refusal that the relay holds and retries,
// and false if the last session did not end on one.
func (r *Relay) Refusal() (Refusal, bool) {
	if r.p == nil {
		return Refusal{}, false
	}
	r.p.mu.Lock()
	defer r.p.mu.Unlock()
	return r.p.refusal, r.p.refusal.Sessions > 0
}

// persistentRefusal judges the session that ended: its earliest event
// refused, with the same code, as in the sessions before it, is counted and
// shown (Relay.Refusal, the log); a persistent one (sink.Persistent), so
// maxPersistent times in a row and over persistentSpan, is an error that
// retrying does not fix (a session that got past that event refuses a later
// one, or none). p.mu must be held.
func (p *pipeline) persistentRefusal(s *epoch) error {
	now := time.Now()
	if p.now != nil {
		now = p.now()
	}
	span := p.stopAfter
	if span == 0 {
		span = persistentSpan
	}
	prev := p.refusal
	switch {
	case s == nil || s.refusedAt == 0:
		if prev.Sessions > 0 && p.log != nil {
			p.log.Info("kafka takes the refused event again", "lsn", prev.At.String(), "refused_with", prev.Code,
				"sessions", prev.Sessions, "after", now.Sub(prev.Since).Round(100*time.Millisecond))
		}
		p.refusal = Refusal{}
		return nil
	case s.refusedAt == prev.At && s.refusedCode == prev.code:
		p.refusal.Sessions++
	default:
		p.refusal = Refusal{At: s.refusedAt, code: s.refusedCode, Code: codeName(s.refusedCode), Since: now, Sessions: 1,
			Persistent: sink.Persistent(s.refusedErr), logged: prev.logged}
		if s.refusedAt == prev.At && prev.Sessions > 0 {
			// The same event refused otherwise: held since the first.
			p.refusal.Since = prev.Since
		}
		p.refusal.Err = s.refusedErr.Error()
		if p.refusal.Persistent {
			p.refusal.StopsAfter = fmt.Sprintf("%d sessions in a row and %s since the first", maxPersistent, span)
		}
	}
	r := &p.refusal
	if r.Persistent && r.Sessions >= maxPersistent && now.Sub(r.Since) >= span {
		return failure.Mark(failure.Fatal, fmt.Errorf("kafka refused the event at %s %d sessions in a row over %s with an error it does not call retriable: %w "+
			"(fix what the broker refuses: topic configuration, ACLs, quotas, the compression codec)", s.refusedAt, r.Sessions, now.Sub(r.Since).Round(time.Second), s.refusedErr))
	}
	if p.log != nil && (prev.Sessions == 0 || now.Sub(r.logged) >= refusalLogEvery) {
		r.logged = now
		what := "walrelay holds it and retries for as long as the broker answers so"
		if r.Persistent {
			what = "walrelay holds it and retries; a code Kafka does not call retriable: it stops after " + r.StopsAfter
		}
		p.log.Warn("kafka refuses an event: "+what+"; the slot's position stays before it",
			"lsn", r.At.String(), "code", r.Code, "sessions", r.Sessions, "since", r.Since.UTC().Format(time.RFC3339), "err", r.Err)
	}
	return nil
}

// codeName is Kafka's name of an error code.
func codeName(code int16) string {
	if ke, ok := kerr.ErrorForCode(code).(*kerr.Error); ok {
		return ke.Message
	}
	return fmt.Sprintf("error code %d", code)
}
