package txn

import (
	"time"

	"github.com/walrelay/walrelay/event"
)

// Policy is when a transaction commits.
type Policy struct {
	// Interval is the age at which an open transaction commits, unless a
	// full round waits behind it.
	Interval time.Duration
	// Timeout is the transaction timeout the broker enforces.
	Timeout time.Duration
	// MaxRecords is how many events a transaction holds at most.
	MaxRecords int
}

// maxAgeFactor bounds how long a catch-up stretches a transaction.
const maxAgeFactor = 10

// MaxAge is the age at which a transaction commits whatever waits behind
// it: maxAgeFactor times Interval, and at most a quarter of Timeout, so
// that the round that ends it, the position record and the commit have
// three quarters of the timeout left before the broker would abort it.
func (p Policy) MaxAge() time.Duration {
	return min(maxAgeFactor*p.Interval, p.Timeout/4)
}

// Current is the open transaction as the flusher sees it, or none. The
// zero value is none. It is the flusher's alone: no lock.
type Current struct {
	open   bool
	began  time.Time
	events int
	bytes  int            // the records' sizes (produce.RecordSize), of the events
	last   event.Position // the position of the last event produced in it
}

// Open reports whether a transaction is open.
func (c *Current) Open() bool { return c.open }

// Begin notes a transaction begun at now, holding nothing yet.
func (c *Current) Begin(now time.Time) {
	c.open, c.began, c.events, c.bytes = true, now, 0, 0
}

// Add counts a record of size bytes produced in the open transaction, of
// the event at pos (nil: a record of no event).
func (c *Current) Add(size int, pos *event.Position) {
	c.events++
	c.bytes += size
	if pos != nil {
		c.last = *pos
	}
}

// End notes that the open transaction ends (it commits or aborts).
func (c *Current) End() { c.open = false }

// Began returns when the open (or last) transaction began.
func (c *Current) Began() time.Time { return c.began }

// Last returns the position of the last event produced in the open (or
// last) transaction: the position it commits.
func (c *Current) Last() event.Position { return c.last }

// Holds returns the records and bytes the open transaction holds (none if
// no transaction is open), for the queue's room (produce.Queue.SetHeld).
func (c *Current) Holds() (records, bytes int) {
	if !c.open {
		return 0, 0
	}
	return c.events, c.bytes
}

// CommitDue reports whether the open transaction should commit at now:
// once it is Interval old, unless a full round already waits behind it
// (backlog: a catch-up, where each commit's round trip would cost
// throughput), then at the latest once it is MaxAge old; and once it holds
// MaxRecords events.
func (c *Current) CommitDue(now time.Time, backlog bool, p Policy) bool {
	if !c.open {
		return false
	}
	age := now.Sub(c.began)
	return c.events >= p.MaxRecords || age >= p.MaxAge() || age >= p.Interval && !backlog
}

// CommitBy returns when the open transaction must commit if nothing more
// arrives (zero if none is open).
func (c *Current) CommitBy(p Policy) time.Time {
	if !c.open {
		return time.Time{}
	}
	return c.began.Add(p.Interval)
}
