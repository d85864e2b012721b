package txn

import (
	"testing"
	"time"

	"github.com/walrelay/walrelay/event"
)

// TestCommitDue: a transaction commits once it is Interval old, unless a
// full round waits behind it, then once it is MaxAge old (at most a
// quarter of the timeout), and once it holds MaxRecords events; none
// commits, holds or is due when none is open.
func TestCommitDue(t *testing.T) {
	t.Parallel()
	p := Policy{Interval: 100 * time.Millisecond, Timeout: 2 * time.Second, MaxRecords: 3}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		age     time.Duration
		events  int
		backlog bool
		due     bool
	}{
		{"young", 50 * time.Millisecond, 1, false, false},
		{"Interval old", 100 * time.Millisecond, 1, false, true},
		{"Interval old, a round waits", 100 * time.Millisecond, 1, true, false},
		{"MaxAge old, a round waits", 500 * time.Millisecond, 1, true, true},
		{"MaxRecords events", 0, 3, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var c Current
			c.Begin(t0)
			for i := range tc.events {
				c.Add(10, &event.Position{CommitLSN: 1, Index: i})
			}
			if due := c.CommitDue(t0.Add(tc.age), tc.backlog, p); due != tc.due {
				t.Fatalf("due %v, want %v", due, tc.due)
			}
			if n, b := c.Holds(); n != tc.events || b != 10*tc.events {
				t.Fatalf("holds %d records of %d bytes, want %d of %d", n, b, tc.events, 10*tc.events)
			}
			if by := c.CommitBy(p); !by.Equal(t0.Add(p.Interval)) {
				t.Fatalf("commit by %v, want %v", by, t0.Add(p.Interval))
			}
			c.End()
			if n, _ := c.Holds(); n != 0 || c.CommitDue(t0.Add(time.Hour), false, p) || !c.CommitBy(p).IsZero() {
				t.Fatal("an ended transaction still holds records, is due or has a time to commit by")
			}
		})
	}
}
