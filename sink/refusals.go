package sink

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pglogrepl"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
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
// cannot fix it (authorization refused, a topic that does not exist and is
// not created), per-event if it concerns this record alone, which is then
// dead-lettered; else retriable: the relay sends the event again by
// restarting the stream from the last confirmed position. The errors the
// sink hands to a Done are marked with their kind.
func kindOf(err error) failure.Kind {
	if failure.IsFatal(err) {
		return failure.Fatal // marked so already (a fenced transaction)
	}
	for _, e := range []error{kerr.TopicAuthorizationFailed, kerr.ClusterAuthorizationFailed, kerr.SaslAuthenticationFailed,
		kerr.UnknownTopicOrPartition, kerr.UnknownTopicID, kerr.InvalidRequiredAcks, kerr.UnsupportedVersion} {
		if errors.Is(err, e) {
			return failure.Fatal
		}
	}
	if perEvent(err) {
		return failure.PerEvent
	}
	return failure.Retriable
}

// Held reports whether err is a broker's answer that a healthy cluster gives
// for a while: a code Kafka calls retriable (a leader or coordinator that
// moves or loads, a timeout, throttling, too few replicas in sync), or one
// that Kafka does not, but that a broker answers with while it recovers:
// UNKNOWN_SERVER_ERROR (an exception inside the broker, as when a log is
// being loaded or a replica fetcher restarts), CONCURRENT_TRANSACTIONS and
// TRANSACTION_ABORTABLE (the coordinator still ends an earlier
// transaction). The relay holds the events refused so, and retries for as
// long as it lasts: it never stops on them.
func Held(err error) bool {
	var ke *kerr.Error
	if !errors.As(err, &ke) {
		return false
	}
	return ke.Retriable || errors.Is(err, kerr.UnknownServerError) || errors.Is(err, kerr.ConcurrentTransactions) || errors.Is(err, kerr.TransactionAbortable)
}

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

// renewHeld returns err, the producer id's initialisation refused, after
// replacing the client if the refusal is one a healthy cluster answers with
// for a while (Held) that the client keeps as final: kgo keeps an
// InitProducerID answer that Kafka does not call retriable
// (UNKNOWN_SERVER_ERROR) for the client's life, so that every later
// transaction would fail with it. The next Resume initialises the new
// client's producer as a first one does. err stays retriable.
func (s *Sink) renewHeld(err error) error {
	if !Held(err) || kerr.IsRetriable(err) || errors.Is(err, kerr.ConcurrentTransactions) {
		return err
	}
	t := s.tx
	s.log.Warn("exactly-once: the broker refused to initialise the producer with an error a broker answers while it recovers; a new producer of the transactional id asks again at the next session",
		"transactional_id", t.cfg.ID, "err", err)
	s.client().Close()
	cl, nerr := kgo.NewClient(s.clOpts...)
	if nerr != nil {
		return failure.Mark(failure.Fatal, fmt.Errorf("create a new kafka producer for transactional id %s after %w: %w", t.cfg.ID, err, nerr))
	}
	s.cl.Store(cl)
	t.mu.Lock()
	t.unresolved = false
	t.mu.Unlock()
	t.started = false
	return err
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
