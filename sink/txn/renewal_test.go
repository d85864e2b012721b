package txn

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/failure"
)

// TestSameSlotIsOfThisSlotAndDatabase: the records that explain a renewal
// as another instance of this slot's (sameSlot): a marker or a position
// of the slot, under the id, of the same database, past the sink's own
// latest record. Not a slot of the same name on another database given
// the same id and offsets topic (it would explain away the fences of a
// shared id), nor a marker of an older walrelay (no source header).
func TestSameSlotIsOfThisSlotAndDatabase(t *testing.T) {
	t.Parallel()
	s := &Producer{cfg: Config{ID: "walrelay-test", Key: "slot_a", Source: "db"}}
	marker := func(at int64, hs ...string) *kgo.Record {
		r := &kgo.Record{Key: []byte("slot_a" + markerSuffix), Offset: at}
		for i := 0; i+1 < len(hs); i += 2 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: hs[i], Value: []byte(hs[i+1])})
		}
		return r
	}
	position := func(at int64, slot, source, id string) *kgo.Record {
		v, err := json.Marshal(positionRecord{Slot: slot, Source: source, CommitLSN: "0/100", TransactionalID: id})
		if err != nil {
			t.Fatal(err)
		}
		return &kgo.Record{Key: []byte(slot), Value: v, Offset: at}
	}
	for _, tc := range []struct {
		name  string
		r     *kgo.Record
		ownAt int64
		want  bool
	}{
		{"a marker of the slot", marker(10, markerIDHeader, "walrelay-test", markerSourceHeader, "db"), 5, true},
		{"a position of the slot", position(10, "slot_a", "db", "walrelay-test"), 5, true},
		{"the sink's own or older", marker(5, markerIDHeader, "walrelay-test", markerSourceHeader, "db"), 5, false},
		{"before the sink's first record", marker(10, markerIDHeader, "walrelay-test", markerSourceHeader, "db"), -1, false},
		{"a marker of another database", marker(10, markerIDHeader, "walrelay-test", markerSourceHeader, "other"), 5, false},
		{"a position of another database", position(10, "slot_a", "other", "walrelay-test"), 5, false},
		{"a marker of an older walrelay", marker(10, markerIDHeader, "walrelay-test"), 5, false},
		{"a marker of another id", marker(10, markerIDHeader, "walrelay-other", markerSourceHeader, "db"), 5, false},
		{"a position of another slot", position(10, "slot_b", "db", "walrelay-test"), 5, false},
	} {
		if got := s.sameSlot(tc.r, tc.ownAt); got != tc.want {
			t.Errorf("%s: sameSlot %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestMayRenewBoundsUnexplainedRenewals: the runaway bound of mayRenew,
// on its own. Renewals that nothing explains are fatal past
// MaxUnexplained within a minute, and, spread out (slots with offsets
// topics of their own sharing an id, at low traffic, fence each other
// only when one commits), past MaxUnexplainedLong within an hour; with
// ErrFencedTooOften, whose text names no other slot (it is not known).
// One after a lost answer (endUnknown) is not counted.
func TestMayRenewBoundsUnexplainedRenewals(t *testing.T) {
	t.Parallel()
	fence := fmt.Errorf("%w: walrelay-test: PRODUCER_FENCED", ErrFenced)
	producerWith := func(ago ...time.Duration) *Producer {
		s := &Producer{cfg: Config{ID: "walrelay-test", Key: "slot_a", OffsetsTopic: "walrelay.offsets"}}
		for _, d := range ago {
			s.unexplained = append(s.unexplained, time.Now().Add(-d))
		}
		return s
	}
	spread := func(n int, every time.Duration) []time.Duration {
		var ago []time.Duration
		for i := n; i > 0; i-- {
			ago = append(ago, time.Duration(i)*every)
		}
		return ago
	}
	for _, tc := range []struct {
		name  string
		ago   []time.Duration
		fatal bool
	}{
		{"5 in a minute, the 6th", spread(MaxUnexplained, time.Second), true},
		{"4 in a minute, the 5th", spread(MaxUnexplained-1, time.Second), false},
		{"20 in an hour, the 21st", spread(MaxUnexplainedLong, 2*time.Minute), true},
		{"19 in an hour, the 20th", spread(MaxUnexplainedLong-1, 2*time.Minute), false},
		{"20 in just over an hour, the 21st", spread(MaxUnexplainedLong, LongWindow/MaxUnexplainedLong+time.Second), false},
	} {
		err := producerWith(tc.ago...).mayRenew(fence)
		if fatal := errors.Is(err, ErrFencedTooOften) && failure.IsFatal(err); fatal != tc.fatal || (err != nil && !fatal) {
			t.Errorf("%s: mayRenew: %v, want fatal ErrFencedTooOften: %v", tc.name, err, tc.fatal)
		}
		if err != nil && (strings.Contains(err.Error(), "of another slot") || !strings.Contains(err.Error(), "walrelay-test")) {
			t.Errorf("%s: the text claims another slot, or does not name the id: %v", tc.name, err)
		}
	}
	s := producerWith(spread(MaxUnexplained, time.Second)...)
	s.endUnknown = true
	if err := s.mayRenew(fence); err != nil {
		t.Errorf("a renewal after a lost answer: %v, want none", err)
	}
}
