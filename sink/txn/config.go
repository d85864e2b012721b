package txn

import (
	"errors"
	"fmt"
	"time"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/sink/record"
)

// Config configures exactly-once production (package sink's
// Config.Transactions, whose type, sink.Transactions, is this one).
type Config struct {
	// ID is the transactional id: stable across restarts of the same
	// relay, so that a new instance fences the old one. Required.
	ID string
	// Interval is how long a transaction stays open at most once it holds
	// a record. Default 10ms.
	Interval time.Duration
	// MaxRecords commits a transaction that holds this many events.
	// Default 10000. The buffers (Config.MaxBufferedRecords and
	// MaxBufferedBytes) bound a transaction too, as its records count
	// against them until it ends: it commits once they are full, so a
	// MaxRecords over MaxBufferedRecords (the defaults: 10000 over 5000)
	// is never reached.
	MaxRecords int
	// OffsetsTopic holds the committed positions, compacted, one
	// partition; created if missing. Default "walrelay.offsets".
	OffsetsTopic string
	// Key keys this relay's positions on the offsets topic: the slot.
	// Required.
	Key string
	// Source names the database the positions are of (its system
	// identifier and name); a position of another source is refused.
	Source string
	// Timeout is the transaction timeout the broker enforces. Default 60s.
	Timeout time.Duration
	// Takeover names a transactional id whose committed position of Key
	// this relay takes over: the first Resume fences it (initialises a
	// producer of that id, which aborts its open transaction) and reads
	// the position again. A position written under an id that is neither
	// ID nor Takeover is refused: two instances of different ids would not
	// fence each other.
	Takeover string
	// AcceptTimeline, if not 0, is a timeline onto which a committed
	// position of an earlier timeline, past that timeline's end, is
	// carried: the events of this timeline from the switch on are
	// published, once an operator has seen what the refusal reports.
	AcceptTimeline int32
	// OnCommit and OnAbort, if set, observe each transaction committed
	// (its last position and how long the commit took) and aborted; they
	// run on the flusher and must not block.
	OnCommit func(last event.Position, took time.Duration)
	OnAbort  func()
}

// Defaults fills the defaults of t and checks it.
func (t *Config) Defaults() error {
	if t.ID == "" || t.Key == "" {
		return errors.New("exactly-once: a transactional id and a key are required")
	}
	if t.Interval <= 0 {
		t.Interval = 10 * time.Millisecond
	}
	if t.MaxRecords <= 0 {
		t.MaxRecords = 10000
	}
	if t.OffsetsTopic == "" {
		t.OffsetsTopic = "walrelay.offsets"
	}
	if !record.ValidTopic(t.OffsetsTopic) {
		return fmt.Errorf("offsets topic %q is not a valid Kafka topic name", t.OffsetsTopic)
	}
	if t.Timeout <= 0 {
		t.Timeout = time.Minute
	}
	if t.Interval >= t.Timeout/4 {
		return fmt.Errorf("transaction interval %s must be under a quarter of the transaction timeout %s", t.Interval, t.Timeout)
	}
	return nil
}

// policy is when a transaction commits (Current.CommitDue).
func (t *Config) policy() Policy {
	return Policy{Interval: t.Interval, Timeout: t.Timeout, MaxRecords: t.MaxRecords}
}
