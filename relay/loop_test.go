package relay

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
)

// TestRestartResendsFromTheConfirmedPosition: a failed publish ends the
// session; the next one, opened after Abort, streams from the confirmed
// position, so a transaction already acknowledged is not sent again and
// the failed one is sent whole, in order.
func TestRestartResendsFromTheConfirmedPosition(t *testing.T) {
	t.Parallel()
	src := newFakeSource(walTxn{[]string{"e1", "e2"}}, walTxn{[]string{"e3", "e4"}})
	pub := &scriptedPublisher{answers: map[string]func(int) (error, bool){
		// e3 waits until e1 and e2 are confirmed, then fails.
		"e3": held,
	}}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errc := pumpRelay(ctx, loopRelay(t, src, pub))
	pub.waitPublished(t, "e1,e2,e3,e4")
	waitfor.Until(t, 30*time.Second, "the first transaction confirmed", func() bool { return src.slotConfirmed() == endLSN(0) })
	pub.answer(t, "e3", errRefused)
	first := <-src.opened
	if err := first.closedWith(t); !errors.Is(err, errRefused) {
		t.Fatalf("the session closed with %v, want the refusal", err)
	}
	pub.waitPublished(t, "e1,e2,e3,e4,abort,e3,e4")
	waitfor.Until(t, 30*time.Second, "the keepalive confirmed", func() bool { return src.slotConfirmed() == keepaliveLSN(2) })
	if second := <-src.opened; second.from != endLSN(0) {
		t.Fatalf("the second session streams from %s, want %s", second.from, endLSN(0))
	}
	cancel()
	if err := result(t, errc); err != nil {
		t.Fatalf("pump: %v", err)
	}
	if n := src.opens(); n != 2 {
		t.Fatalf("%d sessions, want 2", n)
	}
}

// TestAFailureOfAnEarlierSessionIsIgnored: an answer that arrives for an
// event of a session that already ended (a failure the sink reports late)
// neither restarts the current session nor moves its checkpoint: the
// current session resends that event itself. A fatal failure is fatal
// whichever session it comes from: retrying does not fix it.
func TestAFailureOfAnEarlierSessionIsIgnored(t *testing.T) {
	t.Parallel()
	for name, late := range map[string]error{"failed": errRefused, "failed fatally": failure.Mark(failure.Fatal, errRefused), "acknowledged": nil} {
		fatal := failure.IsFatal(late)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			src := newFakeSource(walTxn{[]string{"e1", "e2"}}, walTxn{[]string{"e3"}})
			pub := &scriptedPublisher{answers: map[string]func(int) (error, bool){
				"e1": held, // answered only after the next session streams
				"e2": func(n int) (error, bool) {
					if n == 1 {
						return errRefused, false
					}
					return nil, false
				},
			}}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			r := loopRelay(t, src, pub)
			errc := pumpRelay(ctx, r)
			// Nothing is published once the failure is known (here at once:
			// the answer comes on Publish's goroutine).
			pub.waitPublished(t, "e1,e2,abort,e1,e2,e3")
			// The second session confirms its transactions; its keepalive
			// is not confirmed while the first session's e1 counts as in
			// flight (checkpoint.Reset).
			waitfor.Until(t, 30*time.Second, "the second session's transactions confirmed", func() bool { return src.slotConfirmed() == endLSN(1) })
			if n := r.p.tr.InFlight(); n != 1 {
				t.Fatalf("%d in flight, want the first session's e1", n)
			}
			pub.answer(t, "e1", late)
			if fatal {
				if err := result(t, errc); !errors.Is(err, errRefused) {
					t.Fatalf("pump: %v, want the fatal failure", err)
				}
				return
			}
			time.Sleep(100 * time.Millisecond)
			if n := src.opens(); n != 2 {
				t.Fatalf("%d sessions: an answer for the first session restarted the second", n)
			}
			if n := r.p.tr.InFlight(); n != 0 {
				t.Fatalf("%d in flight after the late answer", n)
			}
			cancel()
			if err := result(t, errc); err != nil {
				t.Fatalf("pump: %v", err)
			}
			if got := src.slotConfirmed(); got != endLSN(1) {
				t.Fatalf("confirmed %s, want %s", got, endLSN(1))
			}
		})
	}
}

// TestDrainReadsToTheEndOfTheTransaction: a stop inside a transaction reads
// on to its commit, waits for its events' acknowledgements, confirms its
// end and closes the session cleanly.
func TestDrainReadsToTheEndOfTheTransaction(t *testing.T) {
	t.Parallel()
	src := newFakeSource(walTxn{[]string{"e1", "e2", "e3"}})
	// Changes: Relation, Begin, e1, e2, ...: the stop comes before e2.
	src.pauseAt = []int{3}
	pub := &scriptedPublisher{answers: map[string]func(int) (error, bool){"e3": held}}
	ctx, cancel := context.WithCancel(t.Context())
	errc := pumpRelay(ctx, loopRelay(t, src, pub))
	pub.waitPublished(t, "e1")
	cancel()
	pub.waitPublished(t, "e1,e2,e3")
	select {
	case err := <-errc:
		t.Fatalf("pump returned (%v) with e3 in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	pub.answer(t, "e3", nil)
	if err := result(t, errc); err != nil {
		t.Fatalf("pump: %v", err)
	}
	sess := <-src.opened
	if err := sess.closedWith(t); err != nil {
		t.Fatalf("the session closed with %v, want cleanly", err)
	}
	if got := src.slotConfirmed(); got != endLSN(0) {
		t.Fatalf("confirmed %s, want the transaction's end %s", got, endLSN(0))
	}
}

// TestFailureDuringTheDrain: a publish that fails while a stop drains ends
// the drain without confirming the transaction; a retriable failure is left
// to the next start (pump returns nil), a fatal one is returned.
func TestFailureDuringTheDrain(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		err   error
		fatal bool
	}{
		{"retriable", errRefused, false},
		{"fatal", failure.Mark(failure.Fatal, errRefused), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			src := newFakeSource(walTxn{[]string{"e1", "e2", "e3"}})
			src.pauseAt = []int{3}
			pub := &scriptedPublisher{answers: map[string]func(int) (error, bool){"e2": held}}
			ctx, cancel := context.WithCancel(t.Context())
			errc := pumpRelay(ctx, loopRelay(t, src, pub))
			pub.waitPublished(t, "e1")
			cancel()
			pub.waitPublished(t, "e1,e2,e3")
			pub.answer(t, "e2", c.err)
			err := result(t, errc)
			if c.fatal != (err != nil) || (err != nil && !errors.Is(err, errRefused)) {
				t.Fatalf("pump: %v, want fatal %v", err, c.fatal)
			}
			sess := <-src.opened
			if reason := sess.closedWith(t); c.fatal && !errors.Is(reason, errRefused) {
				t.Fatalf("the session closed with %v, want the failure", reason)
			}
			if got := src.slotConfirmed(); got != 0 {
				t.Fatalf("confirmed %s: past a failed event", got)
			}
			if n := src.opens(); n != 1 {
				t.Fatalf("%d sessions opened during a stop", n)
			}
		})
	}
}

// TestKeepaliveConfirmsOnlyWhenIdle: a keepalive's WAL end is confirmed
// when nothing is in flight, not while an event waits for its answer.
func TestKeepaliveConfirmsOnlyWhenIdle(t *testing.T) {
	t.Parallel()
	src := newFakeSource(walTxn{[]string{"e1"}}, walTxn{[]string{"e2"}})
	pub := &scriptedPublisher{answers: map[string]func(int) (error, bool){"e2": held}}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errc := pumpRelay(ctx, loopRelay(t, src, pub))
	pub.waitPublished(t, "e1,e2")
	waitfor.Until(t, 30*time.Second, "the first transaction confirmed", func() bool { return src.slotConfirmed() == endLSN(0) })
	sess := <-src.opened
	waitfor.Until(t, 30*time.Second, "the keepalive read", func() bool { return int(sess.next.Load()) == len(sess.changes) })
	time.Sleep(50 * time.Millisecond)
	if got := src.slotConfirmed(); got != endLSN(0) {
		t.Fatalf("confirmed %s while e2 is in flight, want %s", got, endLSN(0))
	}
	pub.answer(t, "e2", nil)
	waitfor.Until(t, 30*time.Second, "the second transaction confirmed", func() bool { return src.slotConfirmed() == endLSN(1) })
	cancel()
	if err := result(t, errc); err != nil {
		t.Fatalf("pump: %v", err)
	}
}
