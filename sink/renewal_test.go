package sink

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
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
	kc.FenceReinit(func() bool {
		if fences.Load() >= cuts.Load() {
			return false
		}
		fences.Add(1)
		return true
	})
	if err := publish(t, s, txnEvent(0x200, 0)); err == nil {
		t.Fatal("an event whose commit was cut was answered as committed")
	}
	// As the relay does at each next session, which holds the slot:
	// Resume, retried while it fails retriably.
	deadline := time.Now().Add(30 * time.Second)
	for err := s.Resume(t.Context(), onTimeline1); err != nil; err = s.Resume(t.Context(), onTimeline1) {
		t.Logf("Resume: %v (cuts %d, fences %d, renewals %d)", err, cuts.Load(), fences.Load(), s.txnCounts().Renewals)
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

// TestExactlyOnceSharedTransactionalIDStops: two relays of different
// slots given the same kafka.transactional_id (one value in a shared
// configuration template: nothing checks it against the slot). Each holds
// its own slot, so to each the other's fence looks false: it would renew
// its producer, which fences the other, which renews in turn, for ever,
// each renewal aborting the other's open transaction. Each side here does
// what the relay does: publish in order; on a failure, Resume (its slot
// is free: OpenUnlessTaken opens it) until it succeeds, then resend from
// its committed position; a fatal error stops that side. A side stops
// naming the id: on one offsets topic with ErrSharedTransactionalID at
// its first renewal, whose read of the committed position finds the
// other slot's marker or position under the id (sharedBy); on offsets
// topics of their own, where nothing shows the other slot, with
// ErrFencedTooOften once unexplained renewals pass maxUnexplained within
// renewWindow (mayRenew). Found by review43b
// (TestProbeSharedTransactionalIDPingPong): 17 to 59 renewals in 6 s,
// neither side stopped.
func TestExactlyOnceSharedTransactionalIDStops(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		ownOffsets   bool // each slot its own kafka.offsets_topic: no evidence in either
		mostRenewals int  // of both sides
		want         error
	}{
		{"one offsets topic", false, 4, ErrSharedTransactionalID},
		{"offsets topics of their own", true, 2 * (maxUnexplained + 1), ErrFencedTooOften},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kc := kafkatest.Start(t)
			const id = "walrelay-shared-by-mistake"
			var sinks []*Sink
			for _, slot := range []string{"slot_a", "slot_b"} {
				cfg := Transactions{ID: id, Key: slot, Source: "db"}
				if tc.ownOffsets {
					cfg.OffsetsTopic = "walrelay.offsets." + slot
				}
				sinks = append(sinks, txnSinkOf(t, kc, cfg))
			}
			a, b := sinks[0], sinks[1]
			type side struct {
				name    string
				s       *Sink
				stopped error
				sent    int
			}
			// Time enough on a loaded machine; one side's stop ends the run.
			var over atomic.Bool
			running := func(until time.Time) bool { return time.Now().Before(until) && !over.Load() }
			stream := func(sd *side, until time.Time) {
				defer over.Store(true)
				lsn := uint64(0x100)
				for running(until) {
					e := txnEvent(pglogrepl.LSN(lsn), 0)
					e.ID = sd.name + "-" + e.ID
					err := publish(t, sd.s, e)
					if err == nil {
						lsn += 0x100
						sd.sent++
						continue
					}
					for err != nil && running(until) {
						if failure.IsFatal(err) && !errors.Is(err, ErrFenced) {
							sd.stopped = err
							return
						}
						err = sd.s.Resume(t.Context(), onTimeline1)
						if failure.IsFatal(err) {
							sd.stopped = err
							return
						}
					}
					// Resend from the committed position, as the slot does.
					lsn = uint64(sd.s.Committed().CommitLSN) + 0x100
				}
			}
			sa, sb := &side{name: "a", s: a}, &side{name: "b", s: b}
			until := time.Now().Add(20 * time.Second)
			done := make(chan struct{})
			go func() { stream(sa, until); close(done) }()
			stream(sb, until)
			<-done
			renewals := a.txnCounts().Renewals + b.txnCounts().Renewals
			t.Logf("a: %d events committed, %d renewals, stopped: %v", sa.sent, a.txnCounts().Renewals, sa.stopped)
			t.Logf("b: %d events committed, %d renewals, stopped: %v", sb.sent, b.txnCounts().Renewals, sb.stopped)
			stopped := sa.stopped
			if stopped == nil {
				stopped = sb.stopped
			}
			if renewals > tc.mostRenewals || !errors.Is(stopped, tc.want) || !strings.Contains(stopped.Error(), id) {
				t.Fatalf("two relays sharing a transactional id fenced each other %d times (a stopped: %v; b stopped: %v), want a stop with %q", renewals, sa.stopped != nil, sb.stopped != nil, tc.want)
			}
		})
	}
}

// TestExactlyOnceRenamedSlotKeepsItsTransactionalID: a slot renamed
// (slot_old to slot_new) under a kafka.transactional_id kept, the old
// name's relay stopped first. The offsets topic holds the old name's
// positions under the id, one of them dated an hour ahead (the old host's
// clock ran fast); the new name's reads of its committed position go
// down to the topic's start (it has none yet) past them all, at its first
// Resume and at later ones. They are older than its first marker: not
// another instance's that runs (sharedBy), whatever their dates say.
func TestExactlyOnceRenamedSlotKeepsItsTransactionalID(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	const id = "walrelay-kept-across-a-rename"
	old := txnSinkOf(t, kc, Transactions{ID: id, Key: "slot_old", Source: "db"})
	for _, lsn := range []pglogrepl.LSN{0x100, 0x200} {
		if err := publish(t, old, txnEvent(lsn, 0)); err != nil {
			t.Fatal(err)
		}
	}
	ahead, err := json.Marshal(map[string]any{"slot": "slot_old", "source": "db", "commit_lsn": "0/300", "index": 0, "transactional_id": id,
		"committed_at": time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	if err := pl.ProduceSync(t.Context(), &kgo.Record{Topic: "walrelay.offsets", Key: []byte("slot_old"), Value: ahead}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	old.Close()
	renamed := txnSinkOf(t, kc, Transactions{ID: id, Key: "slot_new", Source: "db"})
	// Later reads, before and after a position of its own: the renewal's
	// and a commit of unknown outcome's.
	if err := renamed.readCommitted(t.Context()); err != nil {
		t.Fatalf("a second read of the committed position of the renamed slot: %v", err)
	}
	if err := publish(t, renamed, txnEvent(0x100, 0)); err != nil {
		t.Fatal(err)
	}
	if err := renamed.readCommitted(t.Context()); err != nil {
		t.Fatalf("a read of the committed position of the renamed slot after its first commit: %v", err)
	}
	if got, want := renamed.Committed(), (event.Position{CommitLSN: 0x100}); got != want {
		t.Fatalf("committed %s, want %s", got, want)
	}
}

// TestExactlyOnceStandbyOfTheSlotIsNotShared: instances of one slot (a
// standby, a rolling restart; a flapping network) take the slot from this
// one six times within a minute (more than maxUnexplained), each
// initialising the transactional id, which fences this one; each time
// this one gets the slot back (the other's session ended) and renews its
// producer. No lost answer explains these fences, but each renewal's read
// of the committed position passes the other instance's marker (and its
// position, if it committed one) of this slot, past this sink's last
// record (sameSlot): they are explained, not counted, and it goes on.
// Found by review45a (TestProbe45StandbyTakeoversAreNotASharedID): the
// sixth renewal in a minute stopped the relay with
// ErrSharedTransactionalID, "another walrelay instance, of another slot,
// uses the same transactional id", telling the operator to give each slot
// an id of its own.
func TestExactlyOnceStandbyOfTheSlotIsNotShared(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		publishes bool // the standby commits a position, or only its marker
	}{{"the standby commits", true}, {"the standby only reads", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kc := kafkatest.Start(t)
			const id = "walrelay-one-slot"
			cfg := Transactions{ID: id, Key: "slot_a", Source: "db"}
			s := txnSinkOf(t, kc, cfg)
			lsn := pglogrepl.LSN(0x100)
			next := func() *event.Event { lsn += 0x100; return txnEvent(lsn, 0) }
			if err := publish(t, s, next()); err != nil {
				t.Fatal(err)
			}
			takeovers := maxUnexplained + 1
			for i := range takeovers {
				standby := txnSinkOf(t, kc, cfg) // it took the slot: its Resume fences s
				if tc.publishes {
					if err := publish(t, standby, next()); err != nil {
						t.Fatal(err)
					}
				}
				standby.Close() // and lost it
				e := next()
				if err := publish(t, s, e); !errors.Is(err, ErrFenced) {
					t.Fatalf("takeover %d: publish after the standby's initialisation: %v, want the fence", i+1, err)
				}
				if err := resumeSettled(t, s, onTimeline1); err != nil {
					t.Fatalf("takeover %d: Resume of the instance that got the slot back: %v", i+1, err)
				}
				if err := publish(t, s, e); err != nil {
					t.Fatalf("takeover %d: publish after the renewal: %v", i+1, err)
				}
			}
			if s.txnCounts().Renewals != takeovers || s.txnCounts().Unexplained != 0 {
				t.Fatalf("%d renewals, %d of them unexplained; want %d, none", s.txnCounts().Renewals, s.txnCounts().Unexplained, takeovers)
			}
		})
	}
}

// TestExactlyOnceInvalidTxnStateRenews: another producer of the
// transactional id initialises it (an instance of the slot that took it
// for a moment) while this one commits its first marker transaction,
// which the initialisation aborted; the commit that follows is answered
// INVALID_TXN_STATE (kfake takes it for a retry of the transaction's end,
// KIP-890), and franz-go fails the producer id: every later
// initialisation of the client's (ProducerID) is refused so. The client
// can do nothing more, as after a fence, and Resume, in a session that
// holds the slot again, renews the producer. Found with TestSharedTransactionalIDStopsARelay:
// Resume failed with "initialise the transactional producer ...:
// INVALID_TXN_STATE" at every session, about 65 a second, for ever,
// neither renewing nor stopping.
func TestExactlyOnceInvalidTxnStateRenews(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	tc := Transactions{ID: "walrelay-invalid-txn-state", Key: "slot_a", Source: "db"}
	s := newSink(t, kc, Config{Transactions: &tc})
	other := newSink(t, kc, Config{Transactions: &tc})
	for _, sk := range []*Sink{s, other} {
		if err := sk.Ping(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	var held atomic.Bool
	otherErr := make(chan error, 1)
	kc.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		if !req.(*kmsg.EndTxnRequest).Commit || !held.CompareAndSwap(false, true) {
			return nil, nil, false
		}
		// The marker's commit waits while the other producer
		// initialises the id.
		go func() {
			_, _, err := other.client().ProducerID(context.Background())
			otherErr <- err
		}()
		var err error
		kc.SleepControl(func() { err = <-otherErr })
		otherErr <- err
		return nil, nil, false
	})
	// As the relay does at each next session, which holds the slot.
	var err error
	for try := 0; try < 10; try++ {
		if err = s.Resume(t.Context(), onTimeline1); err == nil || failure.IsFatal(err) {
			break
		}
		t.Logf("Resume: %v", err)
	}
	if oerr := <-otherErr; oerr != nil {
		t.Fatalf("the other producer's initialisation: %v", oerr)
	}
	if err != nil {
		t.Fatalf("Resume after INVALID_TXN_STATE, ten times: %v", err)
	}
	if s.txnCounts().Renewals != 1 {
		t.Fatalf("%d renewals, want 1", s.txnCounts().Renewals)
	}
	if err := publish(t, s, txnEvent(0x100, 0)); err != nil {
		t.Fatalf("publish after the renewal: %v", err)
	}
}
