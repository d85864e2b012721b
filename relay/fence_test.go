package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/replication"
	"github.com/walrelay/walrelay/sink"
)

// slotSource is a fakeSource that can open a session unless another
// process streams the slot: when taken is set, one does.
type slotSource struct {
	*fakeSource
	taken  bool
	unless atomic.Int32 // OpenUnlessTaken calls
}

func (s *slotSource) OpenUnlessTaken(ctx context.Context) (session, error) {
	s.unless.Add(1)
	if s.taken {
		return nil, &replication.SlotActiveError{Slot: "walrelay", PID: 4242}
	}
	return s.Open(ctx)
}

// TestAFenceStopsTheRelayOnlyIfTheSlotIsTaken: the sink answers an event
// as fenced (fatal, wrapping sink.ErrFenced). The relay restarts the
// session, opened only unless another process streams the slot: if one
// does, another instance took over, and the relay stops with the fence,
// naming the slot's holder; if not, the fence was no other instance's
// doing, and the new session resends the event (the sink renews its
// producer at Resume). Any other fatal failure stops the relay as before.
func TestAFenceStopsTheRelayOnlyIfTheSlotIsTaken(t *testing.T) {
	t.Parallel()
	fence := failure.Mark(failure.Fatal, fmt.Errorf("%w: walrelay-test: PRODUCER_FENCED", sink.ErrFenced))
	for _, tc := range []struct {
		name  string
		taken bool
	}{{"slot taken", true}, {"slot free", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src := &slotSource{fakeSource: newFakeSource(walTxn{[]string{"e1", "e2"}}, walTxn{[]string{"e3"}}), taken: tc.taken}
			pub := &scriptedPublisher{answers: map[string]func(int) (error, bool){
				"e2": func(n int) (error, bool) {
					if n == 1 {
						return fence, false
					}
					return nil, false
				},
			}}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			r := loopRelay(t, src, pub)
			r.p.renewsFences = true
			errc := pumpRelay(ctx, r)
			if tc.taken {
				err := result(t, errc)
				if !errors.Is(err, sink.ErrFenced) || !failure.IsFatal(err) || !strings.Contains(err.Error(), "pid 4242") {
					t.Fatalf("pump: %v, want the fence, fatal, naming the slot's holder", err)
				}
				if n := src.unless.Load(); n != 1 {
					t.Fatalf("%d opens unless taken, want 1", n)
				}
				return
			}
			pub.waitPublished(t, "e1,e2,abort,e1,e2,e3")
			cancel()
			if err := result(t, errc); err != nil {
				t.Fatalf("pump: %v", err)
			}
			if n, u := src.opens(), src.unless.Load(); n != 2 || u != 1 {
				t.Fatalf("%d sessions, %d opened unless taken; want 2 and 1", n, u)
			}
		})
	}
}
