package relay

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/replication"
	"github.com/walrelay/walrelay/sink"
)

// Regression tests of review43b's probes of the renewal of a fenced
// producer (fence40).

// countingHandler counts the log records whose message contains match.
type countingHandler struct {
	match string
	n     *atomic.Int32
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.match) {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// TestFalseFenceStorm: the relay's own loop with a real exactly-once
// sink on kfake (a scripted WAL of 8,000 transactions, read slowly) while
// the transaction coordinator keeps losing commits' answers: every 150 ms
// the next commit's answer is lost (half of them after the commit
// landed, the brokers then away 300 ms) and the re-initialisation that
// follows is answered PRODUCER_FENCED, the false fence fence40 survives.
// The slot is never taken: the relay must not stop, and what it confirmed
// is in Kafka once each: no duplicate, nothing missing up to the confirmed
// position. Found by review43b (TestProbeFalseFenceStorm): the relay
// stopped (fatal) within a few seconds once a lost answer was the
// renewal's own marker commit, whose fence came to Resume's first-session
// path (sink's TestExactlyOnceFalseFenceInTheRenewalsMarker). It runs 3 s
// (8 s with WALRELAY_TEST_LONG=1).
func TestFalseFenceStorm(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	var renewals atomic.Int32
	var wal []walTxn
	n := 0
	for i := range 8000 {
		var ids []string
		for j := 0; j < 1+i%3; j++ {
			n++
			ids = append(ids, fmt.Sprintf("e%d", n))
		}
		wal = append(wal, walTxn{ids})
	}
	log := slog.New(countingHandler{match: "refused the producer as fenced", n: &renewals})
	sk, err := sink.New(sink.Config{Brokers: kc.Addrs(), Logger: log, Opts: []kgo.Opt{kgo.RetryTimeout(time.Second), kgo.RequestRetries(2)},
		Transactions: &sink.Transactions{ID: "walrelay-storm", Key: "slot_a", Source: "fake/db"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sk.Close)
	if err := sk.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	var arm, fence atomic.Bool
	var cuts, landed, fences atomic.Int32
	kc.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		if !req.(*kmsg.EndTxnRequest).Commit || !arm.CompareAndSwap(true, false) {
			return nil, nil, false
		}
		fence.Store(true)
		c := cuts.Add(1)
		if c%2 == 0 {
			landed.Add(1)
			kc.Down()
			go func() { time.Sleep(300 * time.Millisecond); kc.Up() }()
			return nil, nil, false
		}
		resp := req.(*kmsg.EndTxnRequest).ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = kerr.UnknownServerError.Code
		return resp, nil, true
	})
	kc.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		r := req.(*kmsg.InitProducerIDRequest)
		if r.ProducerID < 0 || !fence.CompareAndSwap(true, false) {
			return nil, nil, false
		}
		fences.Add(1)
		resp := r.ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.ErrorCode, resp.ProducerID, resp.ProducerEpoch = kerr.ProducerFenced.Code, -1, -1
		return resp, nil, true
	})
	run := 3 * time.Second
	if os.Getenv("WALRELAY_TEST_LONG") == "1" {
		run = 8 * time.Second
	}
	ctx, cancel := context.WithTimeout(t.Context(), run)
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			time.Sleep(150 * time.Millisecond)
			arm.Store(true)
		}
	}()
	src := &slotSource{fakeSource: newFakeSource(wal...)}
	src.opened = make(chan *fakeSession, 1<<20)
	r := loopRelay(t, slowSource{src}, sk)
	r.p.renewsFences = true
	errc := pumpRelay(ctx, r)
	var rerr error
	for {
		if src.slotConfirmed() >= commitLSN(len(wal)-1) {
			break
		}
		select {
		case rerr = <-errc:
		case <-time.After(100 * time.Millisecond):
			continue
		}
		break
	}
	arm.Store(false)
	// The slot's position is the confirmed one when the relay stopped.
	t.Logf("relay: %v; confirmed %s of %s; sessions %d; cuts %d (landed %d), fences %d, renewals %d", rerr, src.slotConfirmed(), endLSN(len(wal)-1), src.opens(), cuts.Load(), landed.Load(), fences.Load(), renewals.Load())
	cancel()
	col, err := kafkatest.Collect(kc.Addrs(), `outbox\.event\.order`, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	recs := col.Records()
	col.Close()
	count := map[string]int{}
	for _, r := range recs {
		count[string(kafkatest.Header(r, "id"))]++
	}
	dup, miss := 0, 0
	confirmedEvents := 0
	k := 0
	for i := range len(wal) {
		for range wal[i].ids {
			k++
			id := eventID(fmt.Sprintf("e%d", k))
			c := count[id]
			if commitLSN(i) <= src.slotConfirmed() {
				confirmedEvents++
				if c == 0 {
					miss++
				}
			}
			if c > 1 {
				dup++
			}
		}
	}
	t.Logf("%d records, %d events, %d of them confirmed: %d duplicated, %d confirmed and missing", len(recs), n, confirmedEvents, dup, miss)
	if dup > 0 || miss > 0 {
		t.Fatal("exactly-once broken")
	}
	if rerr != nil {
		t.Fatalf("false fences only (the slot never taken) stopped the relay: %v", rerr)
	}
}

type slowSource struct{ *slotSource }

func (s slowSource) Open(ctx context.Context) (session, error) {
	ss, err := s.slotSource.Open(ctx)
	if err != nil {
		return nil, err
	}
	return slowSession{ss}, nil
}

func (s slowSource) OpenUnlessTaken(ctx context.Context) (session, error) {
	ss, err := s.slotSource.OpenUnlessTaken(ctx)
	if err != nil {
		return nil, err
	}
	return slowSession{ss}, nil
}

type slowSession struct{ session }

func (s slowSession) Next(ctx context.Context) (replication.Change, error) {
	time.Sleep(200 * time.Microsecond)
	return s.session.Next(ctx)
}
