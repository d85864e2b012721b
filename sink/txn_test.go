package sink

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/kafkatest"
)

func txnSink(t *testing.T, kc *kafkatest.Cluster, id string, opts ...kgo.Opt) *Sink {
	t.Helper()
	s := newSink(t, kc, Config{Transactions: &Transactions{ID: id, Key: "slot_a", Source: "db"}, Opts: opts})
	if err := s.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	// As the relay does, a retriable failure of Resume is tried again.
	deadline := time.Now().Add(2 * time.Minute)
	for err := s.Resume(t.Context(), 1<<40); err != nil; err = s.Resume(t.Context(), 1<<40) {
		if failure.IsFatal(err) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		t.Logf("Resume: %v; trying again", err)
	}
	return s
}

func txnEvent(lsn pglogrepl.LSN, index int) *event.Event {
	e := newEvent(fmt.Sprintf("e-%s-%d", lsn, index))
	e.CommitLSN, e.Index = lsn, index
	return e
}

// readCommittedIDs reads the event ids on the order topic with
// read_committed isolation until want are there.
func readCommittedIDs(t *testing.T, kc *kafkatest.Cluster, want int) []string {
	t.Helper()
	col, err := kafkatest.Collect(kc.Addrs(), `outbox\.event\.order`, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	if _, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) >= want }); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // room for one more, which would be a duplicate
	var ids []string
	for _, r := range col.Records() {
		ids = append(ids, string(kafkatest.Header(r, "id")))
	}
	return ids
}

// TestExactlyOnceResumesFromTheCommittedPosition: events are answered once
// their transaction committed; a new sink of the same transactional id
// reads the committed position, answers the events at or before it without
// producing them, and fences the old sink, whose next transaction fails
// fatally.
func TestExactlyOnceResumesFromTheCommittedPosition(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	first := txnSink(t, kc, "walrelay-test")
	for i := range 3 {
		if err := publish(t, first, txnEvent(0x100, i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := first.Committed(); got != (event.Position{CommitLSN: 0x100, Index: 2}) {
		t.Fatalf("committed %s after three acknowledged events, want 0/100#2", got)
	}

	second := txnSink(t, kc, "walrelay-test")
	if got := second.Committed(); got != (event.Position{CommitLSN: 0x100, Index: 2}) {
		t.Fatalf("the new instance read %s, want 0/100#2", got)
	}
	// The stream resent from before: the first three are in Kafka.
	for i := range 3 {
		done := make(chan Delivery, 1)
		second.Publish(t.Context(), txnEvent(0x100, i), func(d Delivery, err error) {
			if err != nil {
				t.Error(err)
			}
			done <- d
		})
		if d := <-done; !d.Skipped {
			t.Fatalf("event %d was produced again", i)
		}
	}
	if err := publish(t, second, txnEvent(0x200, 0)); err != nil {
		t.Fatal(err)
	}
	ids := readCommittedIDs(t, kc, 4)
	if got := strings.Join(ids, ","); got != "e-0/100-0,e-0/100-1,e-0/100-2,e-0/200-0" {
		t.Fatalf("read %s", got)
	}

	// The first instance was fenced: it must never commit again.
	err := publish(t, first, txnEvent(0x300, 0))
	if !errors.Is(err, ErrFenced) || !failure.IsFatal(err) {
		t.Fatalf("the fenced instance's publish: %v, want a fatal ErrFenced", err)
	}
	if got := len(readCommittedIDs(t, kc, 4)); got != 4 {
		t.Fatalf("%d records after the fenced publish, want 4", got)
	}
}

// TestExactlyOnceManyInFlight: thousands of events published without
// waiting, over several transactions: every one is answered once, in
// order of commit, and the committed position is the last.
func TestExactlyOnceManyInFlight(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := txnSink(t, kc, "walrelay-many")
	const n = 6000
	acked := make(chan error, n)
	for i := range n {
		s.Publish(t.Context(), txnEvent(pglogrepl.LSN(0x1000+i/20), i%20), func(_ Delivery, err error) { acked <- err })
	}
	for range n {
		select {
		case err := <-acked:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("an event was not answered within 30 s")
		}
	}
	if got, want := s.Committed(), (event.Position{CommitLSN: 0x1000 + (n-1)/20, Index: 19}); got != want {
		t.Fatalf("committed %s, want %s", got, want)
	}
}

// TestExactlyOnceRefusesAHistoryThatWentBack: a committed position beyond
// the database's WAL (a restored database) is refused at Resume: new
// events at those positions would be skipped.
func TestExactlyOnceRefusesAHistoryThatWentBack(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	first := txnSink(t, kc, "walrelay-history")
	if err := publish(t, first, txnEvent(0x500, 0)); err != nil {
		t.Fatal(err)
	}
	second := newSink(t, kc, Config{Transactions: &Transactions{ID: "walrelay-history", Key: "slot_a", Source: "db"}})
	if err := second.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	err := second.Resume(t.Context(), 0x400)
	if !failure.IsFatal(err) || !strings.Contains(err.Error(), "WAL history went back") {
		t.Fatalf("Resume with the database's WAL at 0/400 and 0/500#0 committed: %v, want a fatal refusal", err)
	}
}

// TestExactlyOnceCommitCutByAnOutage: the brokers go away as a commit is
// sent, and stay away longer than the client retries. The commit's outcome
// is unknown: the events are answered with a retriable error, the sink
// produces nothing until it knows, and Resume, called again once the
// brokers are back, reads the outcome; the process never has to restart.
// Each event is then in Kafka once, whether the commit landed or not.
func TestExactlyOnceCommitCutByAnOutage(t *testing.T) {
	t.Parallel()
	for _, landed := range []bool{true, false} {
		t.Run(fmt.Sprintf("landed=%v", landed), func(t *testing.T) {
			t.Parallel()
			kc := kafkatest.Start(t)
			s := txnSink(t, kc, "walrelay-cut", kgo.RetryTimeout(time.Second), kgo.RequestRetries(2))
			if err := publish(t, s, txnEvent(0x100, 0)); err != nil {
				t.Fatal(err)
			}
			var cut atomic.Bool
			kc.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
				kc.KeepControl()
				if !req.(*kmsg.EndTxnRequest).Commit || !cut.CompareAndSwap(false, true) {
					return nil, nil, false
				}
				kc.Down() // the answer is lost either way
				if landed {
					return nil, nil, false // the broker commits
				}
				return nil, errors.New("cut"), true
			})
			err := publish(t, s, txnEvent(0x200, 0))
			if err == nil || failure.IsFatal(err) {
				t.Fatalf("an event whose commit was cut: %v, want a retriable error", err)
			}
			if err := s.Resume(t.Context(), 1<<40); err == nil || failure.IsFatal(err) {
				t.Fatalf("Resume while the brokers are away: %v, want a retriable error", err)
			}
			kc.Up()
			deadline := time.Now().Add(30 * time.Second)
			for err := s.Resume(t.Context(), 1<<40); err != nil; err = s.Resume(t.Context(), 1<<40) {
				if failure.IsFatal(err) || time.Now().After(deadline) {
					t.Fatalf("Resume once the brokers are back: %v", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			want := event.Position{CommitLSN: 0x100}
			if landed {
				want = event.Position{CommitLSN: 0x200}
			}
			if got := s.Committed(); got != want {
				t.Fatalf("committed %s after the outage, want %s", got, want)
			}
			// The caller resends from its confirmed position.
			for _, e := range []*event.Event{txnEvent(0x100, 0), txnEvent(0x200, 0), txnEvent(0x300, 0)} {
				if err := publish(t, s, e); err != nil {
					t.Fatal(err)
				}
			}
			ids := readCommittedIDs(t, kc, 3)
			if got := strings.Join(ids, ","); got != "e-0/100-0,e-0/200-0,e-0/300-0" {
				t.Fatalf("read %s", got)
			}
		})
	}
}

// TestExactlyOnceLateDeadLetterCannotJoinTheNextTransaction forces the
// interleaving of a dead letter produced after the abort barrier on behalf
// of an event published before it (at 0/100#7, as the callback of a refused
// record does): the stream resends from 0/100#0, and had the late dead
// letter joined the next transaction as its last record, that transaction
// would commit 0/100#7, and the resent 0/100#4 to #6 would be skipped as
// in Kafka. The late dead letter is refused; the committed position is the
// last resent event's, and the next one is produced.
func TestExactlyOnceLateDeadLetterCannotJoinTheNextTransaction(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := txnSink(t, kc, "walrelay-late")
	before := s.q.generation()
	if err := s.Abort(t.Context()); err != nil { // the barrier of a restart
		t.Fatal(err)
	}
	answers := make(chan error, 5)
	for i := range 4 {
		s.Publish(t.Context(), txnEvent(0x100, i), func(_ Delivery, err error) { answers <- err })
	}
	late := txnEvent(0x100, 7)
	s.deadLetter(t.Context(), late, "invalid_record", s.Topic(late), errors.New("refused"), before, func(_ Delivery, err error) { answers <- err })
	var lateErr error
	for range 5 {
		if err := <-answers; err != nil {
			if lateErr != nil {
				t.Fatalf("two failures: %v; %v", lateErr, err)
			}
			lateErr = err
		}
	}
	if !errors.Is(lateErr, ErrNotSent) {
		t.Fatalf("the late dead letter: %v, want ErrNotSent", lateErr)
	}
	if got := s.Committed(); got != (event.Position{CommitLSN: 0x100, Index: 3}) {
		t.Fatalf("committed %s, want 0/100#3", got)
	}
	done := make(chan Delivery, 1)
	s.Publish(t.Context(), txnEvent(0x100, 4), func(d Delivery, err error) {
		if err != nil {
			t.Error(err)
		}
		done <- d
	})
	if d := <-done; d.Skipped {
		t.Fatal("0/100#4 was skipped as committed")
	}
}
