package sink

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pglogrepl"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/sink/produce"

	"github.com/twmb/franz-go/pkg/kerr"
)

// ErrDataLoss breaks the sink when the client detects that the broker may
// have lost records it had acknowledged.
var ErrDataLoss = errors.New("the broker may have lost acknowledged records (out of order sequence or unknown producer id)")

func (s *Sink) lostData(topic string, partition int32) {
	s.q.BreakOn(fmt.Errorf("%w: topic %s partition %d", ErrDataLoss, topic, partition))
	s.dataLoss.Add(1)
	s.log.Error("the producer detected data loss: the broker may have lost records it had acknowledged; restarting from the confirmed position",
		"topic", topic, "partition", partition)
}

// DataLosses returns how many times the client detected data loss.
func (s *Sink) DataLosses() uint64 { return s.dataLoss.Load() }

// suspects are the events (by WAL position and id: the poll source's events
// have no position) whose batch the broker refused for what may be one
// record of it. It is empty but for the rare restart after such a refusal:
// has costs one atomic load then.
type suspects struct {
	n   atomic.Int64
	mu  sync.Mutex
	set map[suspect]struct{}
}

type suspect struct {
	at pglogrepl.LSN
	id string
}

func suspectOf(e *event.Event) suspect { return suspect{e.WALStart, e.ID} }

func (x *suspects) has(at suspect) bool {
	if x.n.Load() == 0 {
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	_, ok := x.set[at]
	return ok
}

func (x *suspects) add(at suspect) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.set == nil {
		x.set = map[suspect]struct{}{}
	}
	x.set[at] = struct{}{}
	x.n.Store(int64(len(x.set)))
}

func (x *suspects) clear(at suspect) {
	if x.n.Load() == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.set, at)
	x.n.Store(int64(len(x.set)))
}

// refusesBatch reports whether err is a broker's refusal that fails a whole
// batch, and the client's other records of the partition with it, for what
// may be one record of it: an invalid record (a compacted topic's null key,
// a broker-side validation), a corrupt batch, an invalid topic.
func refusesBatch(err error) bool {
	return errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.CorruptMessage) || errors.Is(err, kerr.InvalidTopicException)
}

// kindOf classifies a producer error (package failure): fatal if retrying
// cannot fix it (authorization refused), per-event if it concerns this record alone, which is then
// dead-lettered; else retriable: the relay sends the event again by
// restarting the stream from the last confirmed position. The errors the
// sink hands to a Done are marked with their kind.
func kindOf(err error) failure.Kind {
	if failure.IsFatal(err) {
		return failure.Fatal // marked so already (a fenced transaction)
	}
	// A topic unknown to the broker is not among them: a broker whose
	// metadata lags (just restarted, a partition just moved or created)
	// answers so for a while for a topic that exists. It is Persistent: a
	// topic that does not exist and is not created stops the relay once
	// it was refused session after session over a span of time.
	for _, e := range []error{kerr.TopicAuthorizationFailed, kerr.ClusterAuthorizationFailed, kerr.SaslAuthenticationFailed,
		kerr.InvalidRequiredAcks, kerr.UnsupportedVersion} {
		if errors.Is(err, e) {
			return failure.Fatal
		}
	}
	if perEvent(err) {
		return failure.PerEvent
	}
	return failure.Retriable
}

// Held reports whether err is a broker's answer that a healthy cluster
// gives for a while (produce.Held): the relay holds the events refused so,
// and retries for as long as it lasts.
func Held(err error) bool { return produce.Held(err) }

// Persistent reports whether a retriable publish error is a broker's refusal that
// no healthy cluster answers with for long (not Held) and that the sink does
// not answer by sending differently (a batch refused as too large, or for
// one record of it): a refusal that may well come again, every time
// (POLICY_VIOLATION, UNSUPPORTED_COMPRESSION_TYPE). The caller restarts,
// and gives up only when it came again session after session over a span
// of time that a broker's restart does not fill.
func Persistent(err error) bool {
	var ke *kerr.Error
	return errors.As(err, &ke) && !Held(err) && !errors.Is(err, ErrNotSent) && (!perEvent(err) || errors.Is(err, ErrDeadLetterFailed))
}

// Refused reports whether err is a broker's refusal of the record it is
// the answer of (a Kafka error code; not one of the records not sent
// because an earlier one failed), for the relay to show while it retries.
func Refused(err error) bool {
	var ke *kerr.Error
	return errors.As(err, &ke) && !errors.Is(err, ErrNotSent)
}

// perEvent reports whether err concerns this record only, so that the
// record belongs on the dead-letter topic and the stream may go on.
func perEvent(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) || refusesBatch(err)
}

func reason(err error) string {
	switch {
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return "too_large"
	case errors.Is(err, kerr.InvalidTopicException):
		return "invalid_topic"
	default:
		return "invalid_record"
	}
}
