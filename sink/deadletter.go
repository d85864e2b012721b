package sink

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/deadletter"
	"github.com/walrelay/walrelay/internal/textcut"
	"github.com/walrelay/walrelay/sink/produce"
	"github.com/walrelay/walrelay/sink/record"
)

// ReasonMessageBeforePrivileges is the dead-letter reason (HeaderReason) of
// a logical decoding message from a transaction older than the horizon
// walrelay migrate recorded once only the outbox's writers could emit
// messages (event.ErrBeforePrivileges): any role may have written it.
const ReasonMessageBeforePrivileges = "message_before_privileges"

// Dead-letter record headers, besides those of the event.
const (
	HeaderError    = "walrelay.error"     // the error text
	HeaderReason   = "walrelay.reason"    // invalid_event, invalid_topic, forbidden_topic, invalid_partition, too_large, invalid_record, max_attempts, message_before_privileges
	HeaderSource   = "walrelay.table"     // schema.table, or "message"
	HeaderWALStart = "walrelay.wal_start" // LSN of the change itself
	HeaderTopic    = "walrelay.topic"     // the topic it was meant for, if known
	HeaderOmitted  = "walrelay.payload_omitted_bytes"
	// HeaderKeyHeadersOmitted is the bytes of the key and of the event's
	// headers (names and values) left out of a dead letter that would be
	// over the dead-letter topic's cap without its value.
	HeaderKeyHeadersOmitted = deadletter.HeaderKeyHeadersOmitted
	// HeaderIDOmitted is the bytes cut from the end of the id of a dead
	// letter whose id alone is over the dead-letter topic's cap: its id
	// header holds a prefix of the event's id, and dlq replay does not
	// replay it.
	HeaderIDOmitted = deadletter.HeaderIDOmitted
	deadLetterTries = 2
)

// Dead-letter record headers of a consumer (package inbox), besides
// HeaderError, HeaderReason and HeaderTopic (the topic the record came
// from) and the record's own headers.
const (
	HeaderAttempts     = "walrelay.attempts"      // how many times the handler ran
	HeaderFirstFailure = "walrelay.first_failure" // RFC 3339 time of the first failure
	HeaderLastFailure  = "walrelay.last_failure"  // RFC 3339 time of the last failure
	HeaderPartition    = "walrelay.partition"     // the source record's partition
	HeaderOffset       = "walrelay.offset"        // the source record's offset
	HeaderConsumer     = "walrelay.consumer"      // the inbox consumer's name
)

// ErrDeadLetterFailed wraps the failure of a dead letter to reach the
// dead-letter topic: a refusal of it that Kafka does not call retriable
// counts as persistent (Persistent), even one that concerns the record
// alone, since there is no further place for it.
var ErrDeadLetterFailed = errors.New("dead-letter")

// Header returns the value of r's first header named key, "" if none: how
// tools read walrelay's headers back (the id, the dead-letter reason).
func Header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// DeadLetter produces e to the dead-letter topic for reason (the
// walrelay.reason header) with cause as its error, instead of to its topic;
// done reports it as Publish does. The poll source sends a row there that
// failed too many times.
func (s *Sink) DeadLetter(ctx context.Context, e *event.Event, reason string, cause error, done Done) {
	s.deadLetter(ctx, e, reason, s.Topic(e), cause, 0, done)
}

// deadLetter produces e to the dead-letter topic. If that record is too large
// too, it goes again without its value, with the value's size in a header:
// the row itself is still in the table and in the WAL at its position. One
// whose key and headers alone are over the cap goes without its value and
// without them (shedKeyHeaders) at once. The error and the topic meant are
// clipped to deadletter.MaxText bytes: an invalid topic built from a wide
// aggregate type is in both. gen is the queue's generation when e was
// published (0: any).
func (s *Sink) deadLetter(ctx context.Context, e *event.Event, why, topic string, cause error, gen uint64, done Done) {
	s.log.Warn("dead-lettering event", "id", textcut.ID(e.ID), "reason", why, "lsn", e.CommitLSN.String(), "source", e.Source, "err", cause)
	h0 := s.records.Headers(e, 7) // the dead-letter record gets the clock's time
	s.stamps.of(e)                // but counts toward the clock's next read, as every record built
	h := append(h0,
		kgo.RecordHeader{Key: HeaderError, Value: deadletter.Clip(cause.Error(), deadletter.MaxText)},
		kgo.RecordHeader{Key: HeaderReason, Value: []byte(why)},
		kgo.RecordHeader{Key: HeaderSource, Value: []byte(e.Source)},
		kgo.RecordHeader{Key: HeaderWALStart, Value: []byte(e.WALStart.String())},
		kgo.RecordHeader{Key: HeaderTopic, Value: deadletter.Clip(topic, deadletter.MaxText)},
	)
	r := &kgo.Record{Topic: s.cfg.DLQTopic, Partition: -1, Key: record.RawKey(e), Value: e.Payload, Headers: h}
	if e.OmittedBytes > 0 {
		// Too large to hold: the payload was never read.
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderOmitted, Value: strconv.AppendInt(nil, e.OmittedBytes, 10)})
	}
	omit := func() {
		if r.Value == nil {
			return
		}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderOmitted, Value: strconv.AppendInt(nil, int64(len(r.Value)), 10)})
		r.Value = nil
	}
	if s.shedKeyHeaders(r, len(h0)) {
		omit()
	}
	var pos *event.Position
	if s.tx != nil {
		p := e.Position()
		pos = &p
		// A record the client refused would doom the transaction: one too
		// large goes without its value at once, as does one the broker
		// refused as too large in an earlier transaction.
		if _, over := s.overCap(r); over || s.tx.Poisons().OmitValue(e) {
			omit()
		}
	}
	var send func(try int)
	send = func(try int) {
		s.q.Push(ctx, r, false, pos, gen, func(r *kgo.Record, err error) {
			switch {
			case err == nil:
				if s.tx != nil {
					s.tx.Poisons().Forget(e) // committed
				}
				done(Delivery{Topic: s.cfg.DLQTopic, Partition: r.Partition, DeadLetter: why, Offset: r.Offset}, nil)
			case errors.Is(err, produce.ErrStale):
				done(Delivery{Topic: s.cfg.DLQTopic, Partition: -1, DeadLetter: why}, err)
			case s.tx != nil && errors.Is(err, kerr.MessageTooLarge) && r.Value != nil:
				// The transaction is doomed: the next time, in the
				// next session, the dead letter goes without its value.
				s.tx.Poisons().Add(e, why, cause, true)
				s.q.BreakOn(err)
				done(Delivery{Topic: s.cfg.DLQTopic, Partition: r.Partition, DeadLetter: why}, failure.Mark(failure.Retriable, fmt.Errorf("dead-letter event %s to %s: too large (sent again without its value): %w", textcut.ID(e.ID), s.cfg.DLQTopic, err)))
			case try < deadLetterTries && errors.Is(err, kerr.MessageTooLarge) && r.Value != nil:
				omit()
				go send(try + 1)
			default:
				s.q.BreakOn(err)
				// A dead letter that fails is fatal or retriable, never per
				// event: there is no further place for it.
				kind := kindOf(err)
				if kind != failure.Fatal {
					kind = failure.Retriable
				}
				done(Delivery{Topic: s.cfg.DLQTopic, Partition: r.Partition, DeadLetter: why}, failure.Mark(kind, fmt.Errorf("%w event %s to %s (after %s): %w", ErrDeadLetterFailed, textcut.ID(e.ID), s.cfg.DLQTopic, deadletter.Clip(cause.Error(), deadletter.MaxText), err)))
			}
		})
	}
	send(1)
}

// shedKeyHeaders makes r, a dead letter whose first own headers are what
// record.Builder.Headers gave of the event (the id, the optional ones, the
// configured columns), fit the dead-letter topic's cap when its key and
// headers alone are over it: a wide aggregate id or header column, which
// postgres.max_message_bytes lets through, would make the client refuse
// the dead letter, retriably, and the stream restart on the event for
// ever. It leaves out the key and the event's headers, the largest first,
// until r without its value fits, and says how many bytes it left out
// (HeaderKeyHeadersOmitted); walrelay.lsn, walrelay.xid,
// walrelay.commit_time and the dead-letter headers (their texts clipped)
// stay. The id stays too (it is how a dead letter is counted and
// replayed), whole unless it alone is over the cap: then it is cut to
// what fits, with HeaderIDOmitted. It reports whether it left anything
// out: the value is then left out too.
func (s *Sink) shedKeyHeaders(r *kgo.Record, own int) bool {
	capBytes := int(s.batchCapOf(r.Topic))
	// Room for the header that says the value was left out.
	excess := deadletter.Size(r) - len(r.Value) - (capBytes - 64)
	omitted, idOmitted := deadletter.Fit(r, excess, func(i int) bool {
		if i >= own {
			return false // walrelay's dead-letter headers
		}
		switch r.Headers[i].Key {
		case record.OptionalHeaders[1], record.OptionalHeaders[2], record.HeaderCommitTime:
			return false
		}
		return true
	}, 0)
	if omitted == 0 && idOmitted == 0 {
		return false
	}
	s.log.Warn("dead letter without its key or headers over the dead-letter topic's cap", "id", string(deadletter.Clip(Header(r, record.HeaderID), 128)), "topic", r.Topic,
		"omitted_bytes", omitted, "id_omitted_bytes", idOmitted, "cap", capBytes)
	return true
}
