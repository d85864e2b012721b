package sink

import (
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/walrelay/walrelay/event"
)

// stamps is the Kafka timestamp of the records of events without a time
// of their own: the clock read once per transaction and again every
// stampEvery records of a large one, rather than once per record as the
// client would (a clock read is 8% of walrelay's CPU while it catches up).
// Kafka timestamps are milliseconds.
type stamps struct {
	mu     sync.Mutex
	lsn    pglogrepl.LSN
	xid    uint32
	commit time.Time // events without a position (poll, replay) differ only in it
	stamp  time.Time
	uses   int
}

const stampEvery = 256

// of returns the timestamp of a record of e.
func (s *stamps) of(e *event.Event) time.Time {
	s.mu.Lock()
	if s.stamp.IsZero() || s.lsn != e.CommitLSN || s.xid != e.Xid || !s.commit.Equal(e.CommitTime) {
		s.lsn, s.xid, s.commit, s.stamp, s.uses = e.CommitLSN, e.Xid, e.CommitTime, time.Now(), 0
	} else if s.uses++; s.uses == stampEvery {
		s.stamp, s.uses = time.Now(), 0
	}
	stamp := s.stamp
	s.mu.Unlock()
	return stamp
}
