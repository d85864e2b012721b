package sink

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// Regression tests of review43b's probes of the renewal of a fenced
// producer (fence40).

// TestExactlyOnceFalseFenceInTheRenewalsMarker: the false fence of
// TestExactlyOnceFalseFenceAfterACutCommit (a commit whose answer is lost,
// then the producer's re-initialisation answered PRODUCER_FENCED) happens
// twice: once to an events' transaction, which Resume survives by renewing
// the producer, and once more to the marker transaction that the renewal's
// read of the committed position commits (the coordinator still cut off).
// The session that called Resume still holds the slot: no other instance
// streams it, so the renewal is done again, as it was the first time. The
// second fence comes out of Resume's first-session path (started false
// after renewClient: ProducerID, readCommitted), which records it and
// returns a retriable error (fencedAtStart); the next Resume renews.
// Found by review43b (TestProbeFalseFenceInTheRenewalsMarker): the path
// returned the fence as fatal, and the relay stopped though it held the
// slot.
func TestExactlyOnceFalseFenceInTheRenewalsMarker(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := txnSink(t, kc, "walrelay-probe-marker-fence", kgo.RetryTimeout(time.Second), kgo.RequestRetries(2))
	if err := publish(t, s, txnEvent(0x100, 0)); err != nil {
		t.Fatal(err)
	}
	// Two commits' answers are lost: the events' transaction's and the
	// renewal's marker's; each time the re-initialisation that follows
	// (at the client's id and epoch) is answered PRODUCER_FENCED.
	var cuts, fences atomic.Int32
	kc.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		if !req.(*kmsg.EndTxnRequest).Commit || cuts.Load() >= 2 {
			return nil, nil, false
		}
		cuts.Add(1)
		resp := req.(*kmsg.EndTxnRequest).ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = kerr.UnknownServerError.Code
		return resp, nil, true
	})
	kc.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		r := req.(*kmsg.InitProducerIDRequest)
		if r.ProducerID < 0 || fences.Load() >= cuts.Load() {
			return nil, nil, false
		}
		fences.Add(1)
		resp := r.ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.ErrorCode, resp.ProducerID, resp.ProducerEpoch = kerr.ProducerFenced.Code, -1, -1
		return resp, nil, true
	})
	if err := publish(t, s, txnEvent(0x200, 0)); err == nil {
		t.Fatal("an event whose commit was cut was answered as committed")
	}
	// As the relay does at each next session, which holds the slot:
	// Resume, retried while it fails retriably.
	deadline := time.Now().Add(30 * time.Second)
	for err := s.Resume(t.Context(), onTimeline1); err != nil; err = s.Resume(t.Context(), onTimeline1) {
		t.Logf("Resume: %v (cuts %d, fences %d, renewals %d)", err, cuts.Load(), fences.Load(), s.tx.renewals)
		if failure.IsFatal(err) || time.Now().After(deadline) {
			t.Fatalf("Resume, in a session that holds the slot, after a second false fence (the renewal's marker): %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got, want := s.Committed(), (event.Position{CommitLSN: 0x100}); got != want {
		t.Fatalf("committed %s, want %s", got, want)
	}
	for _, e := range []*event.Event{txnEvent(0x200, 0), txnEvent(0x300, 0)} {
		if err := publish(t, s, e); err != nil {
			t.Fatalf("publish %s after the false fences: %v", e.ID, err)
		}
	}
	if got := strings.Join(readCommittedIDs(t, kc, 3), ","); got != "e-0/100-0,e-0/200-0,e-0/300-0" {
		t.Fatalf("read %s", got)
	}
}
