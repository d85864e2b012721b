package inbox

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/walrelay/walrelay/internal/backoff"
	"github.com/walrelay/walrelay/internal/deadletter"
	"github.com/walrelay/walrelay/sink"
)

// deadLetter sends r to the dead-letter topic, retrying until the broker
// acknowledges it or the worker stops, then marks it and moves on. A
// refusal that retrying cannot fix (authorization) stops the consumer;
// one as too large makes the dead letter smaller (shrink). The error is
// clipped to deadletter.MaxText bytes: a handler's or a validator's may
// quote the record.
func (w *worker) deadLetter(r *kgo.Record, reason string, cause error) {
	first := w.firstFail
	if w.attempts == 0 {
		first = time.Now()
	}
	if !w.sendDeadLetter(r, reason, cause, w.attempts+w.cuts, first) {
		return
	}
	w.mark(r)
	w.pop(1)
	w.attempts, w.cuts = 0, 0
}

// sendDeadLetter sends r's dead letter, with its attempts and the time
// of its first failure, and counts it; false if it was not written (the
// worker stopped, or the consumer is stopping).
func (w *worker) sendDeadLetter(r *kgo.Record, reason string, cause error, attempts int, first time.Time) bool {
	c := w.c
	now := time.Now().UTC()
	h := append([]kgo.RecordHeader(nil), r.Headers...)
	h = append(h,
		kgo.RecordHeader{Key: sink.HeaderReason, Value: []byte(reason)},
		kgo.RecordHeader{Key: sink.HeaderError, Value: deadletter.Clip(cause.Error(), deadletter.MaxText)},
		kgo.RecordHeader{Key: sink.HeaderAttempts, Value: []byte(strconv.Itoa(attempts))},
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
	c.log.Warn("dead-lettering a record", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "id", logID(r), "reason", reason, "attempts", attempts, "err", cause)
	err := w.produceDeadLetter(r, dl, len(r.Headers))
	endDeadLetterSpan(span, reason, err)
	if err != nil {
		return false
	}
	c.m.deadLettered.WithLabelValues(r.Topic, reason).Inc()
	return true
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
