package sink

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// heldTxnSink is txnSinkOf with the buffers of cfg.
func heldTxnSink(t *testing.T, kc *kafkatest.Cluster, cfg Config) *Sink {
	t.Helper()
	s := newSink(t, kc, cfg)
	startTxn(t, s)
	return s
}

// TestExactlyOnceFullBuffersCommitAtOnce (review40): once the open
// transaction's records fill the buffers, nothing more can join it: it
// commits then, not once it is Interval old, so that Publish's throughput
// is not MaxBufferedRecords per Interval.
func TestExactlyOnceFullBuffersCommitAtOnce(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	const interval = time.Second
	s := heldTxnSink(t, kc, Config{MaxBufferedRecords: 2,
		Transactions: &Transactions{ID: "held-full", Key: "slot_a", Source: "db", Interval: interval}})
	const n = 8
	answered := make(chan error, n)
	start := time.Now()
	for i := range n {
		s.Publish(t.Context(), txnEvent(pglogrepl.LSN(0x100+i), 0), func(_ Delivery, err error) { answered <- err })
	}
	for range n {
		if err := <-answered; err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	t.Logf("%d events, MaxBufferedRecords 2, Interval %s: all answered after %s", n, interval, took)
	// The last transaction, which nothing waits behind, commits at the
	// Interval; each full one before it at once.
	if took > 2*interval {
		t.Fatalf("%d events took %s (%.1f Intervals): the flusher waited the Interval for each full buffer, though nothing more could join the transaction", n, took.Round(time.Millisecond), float64(took)/float64(interval))
	}
	ids := readCommittedIDs(t, kc, n)
	if len(ids) != n {
		t.Fatalf("read_committed %v, want %d events once", ids, n)
	}
}

// TestExactlyOnceHoldsNoMoreBytesThanItsBuffers (review40): the byte half
// of TestExactlyOnceHoldsNoMoreThanItsBuffers: 100 kB events,
// MaxBufferedBytes 4 MiB; the payload bytes published and not yet answered
// stay within it (plus the one being let in).
func TestExactlyOnceHoldsNoMoreBytesThanItsBuffers(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	const limit = 4 << 20
	s := heldTxnSink(t, kc, Config{MaxBufferedBytes: limit, BatchMaxBytes: 1 << 20,
		Transactions: &Transactions{ID: "held-bytes", Key: "slot_a", Source: "db", Interval: 50 * time.Millisecond}})
	const n, size = 400, 100_000
	var open, most atomic.Int64
	answered := make(chan error, n)
	for i := range n {
		e := txnEvent(pglogrepl.LSN(0x100+i), 0)
		e.Payload = []byte(fmt.Sprintf(`{"a":"%0*d"}`, size, i))
		l := int64(len(e.Payload))
		if o := open.Add(l); o > most.Load() {
			most.Store(o)
		}
		s.Publish(t.Context(), e, func(_ Delivery, err error) { open.Add(-l); answered <- err })
	}
	for range n {
		select {
		case err := <-answered:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("an event was not answered within 30 s")
		}
	}
	t.Logf("at most %d payload bytes published and not yet answered (MaxBufferedBytes %d)", most.Load(), limit)
	if most.Load() > limit+size+16 {
		t.Fatalf("%d bytes held, over MaxBufferedBytes %d", most.Load(), limit)
	}
}
