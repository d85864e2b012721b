package sink

import (
	"errors"
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

// TestExactlyOnceFalseFenceAfterACutCommit: a commit's answer is lost, and
// the producer's re-initialisation that follows (at its producer id and
// epoch) is answered PRODUCER_FENCED, though no other producer of the
// transactional id ran (seen on a 3-broker cluster with the coordinator cut
// off the network). The client never recovers from that answer. Resume,
// called at the next session, which holds the slot, makes a new producer of
// the id and reads the committed position again: the sink carries on in
// the same process, and each event is in Kafka once, whether the commit
// landed or not. (Before, Resume failed fatally, "another walrelay
// instance took over the transactional id (fenced)", and only a restart
// resumed.) The fence is answered either to the abort that follows the
// failed commit, or to the next Resume's.
func TestExactlyOnceFalseFenceAfterACutCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		landed bool // the broker committed the transaction whose answer was lost
		outage bool // the brokers stay away until the publish failed: the fence is answered to Resume
	}{
		{name: "fenced in the abort, commit not landed"},
		{name: "fenced in Resume, commit landed", landed: true, outage: true},
		{name: "fenced in Resume, commit not landed", outage: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kc := kafkatest.Start(t)
			hooks := &lifecycleHooks{}
			s := txnSink(t, kc, "walrelay-false-fence", kgo.RetryTimeout(time.Second), kgo.RequestRetries(2), kgo.WithHooks(hooks))
			// What the hooks saw of the start: the producer created, and
			// the client that produce.SplitHooks makes to find them.
			created, closed := hooks.created.Load(), hooks.closed.Load()
			if err := publish(t, s, txnEvent(0x100, 0)); err != nil {
				t.Fatal(err)
			}
			var cut, fence, fenced atomic.Bool
			kc.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
				kc.KeepControl()
				if !req.(*kmsg.EndTxnRequest).Commit || !cut.CompareAndSwap(false, true) {
					return nil, nil, false
				}
				fence.Store(true)
				if tc.outage {
					kc.Down() // the answer is lost either way
					if tc.landed {
						return nil, nil, false // the broker commits
					}
					return nil, errors.New("cut"), true
				}
				// An answer the client cannot read the outcome from, as
				// from a broker that lost its connection to the
				// coordinator's log.
				resp := req.(*kmsg.EndTxnRequest).ResponseKind().(*kmsg.EndTxnResponse)
				resp.ErrorCode = kerr.UnknownServerError.Code
				return resp, nil, true
			})
			kc.FenceReinit(func() bool { return fence.Load() && fenced.CompareAndSwap(false, true) })
			err := publish(t, s, txnEvent(0x200, 0))
			t.Logf("the event whose commit was cut: %v", err)
			if err == nil {
				t.Fatal("an event whose commit was cut was answered as committed")
			}
			if tc.outage {
				kc.Up()
			}
			// As the relay does at the next session, which holds the
			// slot: Resume, retried while it fails retriably.
			deadline := time.Now().Add(30 * time.Second)
			for err := s.Resume(t.Context(), onTimeline1); err != nil; err = s.Resume(t.Context(), onTimeline1) {
				if failure.IsFatal(err) || time.Now().After(deadline) {
					t.Fatalf("Resume after the false fence: %v", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !fenced.Load() {
				t.Fatal("the producer's re-initialisation was never answered PRODUCER_FENCED")
			}
			if s.txnCounts().Renewals != 1 {
				t.Fatalf("%d producers renewed, want 1", s.txnCounts().Renewals)
			}
			want := event.Position{CommitLSN: 0x100}
			if tc.landed {
				want = event.Position{CommitLSN: 0x200}
			}
			if got := s.Committed(); got != want {
				t.Fatalf("committed %s after the false fence, want %s", got, want)
			}
			// The stream resends from its confirmed position.
			for _, e := range []*event.Event{txnEvent(0x100, 0), txnEvent(0x200, 0), txnEvent(0x300, 0)} {
				if err := publish(t, s, e); err != nil {
					t.Fatalf("publish %s after the false fence: %v", e.ID, err)
				}
			}
			ids := readCommittedIDs(t, kc, 3)
			if got := strings.Join(ids, ","); got != "e-0/100-0,e-0/200-0,e-0/300-0" {
				t.Fatalf("read %s", got)
			}
			// A hook that registers metrics at a client's creation (kprom)
			// sees the producer created once and never closed across the
			// renewal (a second creation raced with the old producer's hook
			// goroutines, and its close unregistered the metrics), and
			// the renewed producer's batches.
			batches := hooks.batches.Load()
			if err := publish(t, s, txnEvent(0x400, 0)); err != nil {
				t.Fatal(err)
			}
			if n, c := hooks.created.Load()-created, hooks.closed.Load()-closed; n != 0 || c != 0 {
				t.Errorf("the hooks saw %d producers created and %d closed across the renewal, want none", n, c)
			}
			if hooks.batches.Load() == batches {
				t.Error("the hooks saw no batch of the renewed producer")
			}
			s.Close()
			if c := hooks.closed.Load() - closed; c != 1 {
				t.Errorf("the hooks saw %d producers closed at Close, want 1", c)
			}
		})
	}
}

// lifecycleHooks counts what a metrics hook such as kprom sees of the
// producer.
type lifecycleHooks struct{ created, closed, batches atomic.Int32 }

func (h *lifecycleHooks) OnNewClient(*kgo.Client)    { h.created.Add(1) }
func (h *lifecycleHooks) OnClientClosed(*kgo.Client) { h.closed.Add(1) }
func (h *lifecycleHooks) OnProduceBatchWritten(kgo.BrokerMetadata, string, int32, kgo.ProduceBatchMetrics) {
	h.batches.Add(1)
}
