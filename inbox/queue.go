package inbox

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A worker's queue: the records fetched for its partition and not yet
// done, which it takes in batches; fetching the partition pauses while
// too many wait (held records count too) and resumes when few do.

// push queues records fetched for the partition; fetching pauses while
// MaxBufferedRecords wait.
func (w *worker) push(recs []*kgo.Record, hwm int64) {
	w.mu.Lock()
	w.queue = append(w.queue, recs...)
	w.hwm = hwm
	pause := !w.paused && len(w.queue)+len(w.held) >= w.c.cfg.MaxBufferedRecords
	w.paused = w.paused || pause
	w.mu.Unlock()
	if pause {
		w.cl.PauseFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// pop drops the first n queued records (handled, dead-lettered or held),
// and resumes fetching once few records wait.
func (w *worker) pop(n int) {
	w.mu.Lock()
	for _, r := range w.queue[:n] {
		delete(w.runs, r.Offset)
		delete(w.heldSince, r.Offset)
	}
	w.queue = w.queue[n:]
	if len(w.queue) == 0 {
		w.queue = nil
	}
	resume := w.paused && len(w.queue)+len(w.held) < w.c.cfg.MaxBufferedRecords/2
	w.paused = w.paused && !resume
	w.mu.Unlock()
	if resume {
		w.cl.ResumeFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
	}
}

// resume resumes fetching a partition paused by this worker: a pause
// outlives the assignment in the client.
func (w *worker) resume() {
	w.mu.Lock()
	paused := w.paused
	w.paused = false
	w.mu.Unlock()
	if paused {
		w.cl.ResumeFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
	}
}

// next returns the next batch's records, or nil once stopped. A record
// that failed is retried alone. Held records that waited VersionWait are
// dead-lettered meanwhile.
func (w *worker) next() []*kgo.Record {
	for {
		select {
		case <-w.stopCh:
			return nil
		default:
		}
		w.expireHeld()
		var expiry <-chan time.Time
		if at, ok := w.nextExpiry(); ok {
			expiry = time.After(time.Until(at))
		}
		w.mu.Lock()
		n := min(len(w.queue), w.c.cfg.BatchMaxRecords)
		if w.attempts > 0 || (n > 0 && w.queue[0].Offset <= w.isolate) {
			n = min(n, 1)
		}
		recs := w.queue[:n:n]
		w.mu.Unlock()
		if n > 0 {
			return recs
		}
		select {
		case <-w.wake:
		case <-expiry:
		case <-w.stopCh:
			return nil
		}
	}
}
