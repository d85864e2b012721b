package sink

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

func txnSink(t *testing.T, kc *kafkatest.Cluster, id string, opts ...kgo.Opt) *Sink {
	t.Helper()
	return txnSinkOf(t, kc, Transactions{ID: id, Key: "slot_a", Source: "db"}, opts...)
}

// txnSinkOf is txnSink with the Transactions of tc.
func txnSinkOf(t *testing.T, kc *kafkatest.Cluster, tc Transactions, opts ...kgo.Opt) *Sink {
	t.Helper()
	s := newSink(t, kc, Config{Transactions: &tc, Opts: opts})
	startTxn(t, s)
	return s
}

// startTxn pings the exactly-once sink s and resumes it as the relay
// does: a retriable failure of Resume (a reader of the offsets topic that
// stalls on a loaded machine fails it after readIdleTimeout) is tried
// again.
func startTxn(t *testing.T, s *Sink) {
	t.Helper()
	if err := s.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := resumeSettled(t, s, onTimeline1); err != nil {
		t.Fatal(err)
	}
}

// resumeSettled resumes s on h as the relay does, trying a retriable
// failure again (for up to 2 minutes), and returns nil or the first fatal
// error: what a test of Resume's refusals compares.
func resumeSettled(t *testing.T, s *Sink, h event.WALHistory) error {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	err := s.Resume(t.Context(), h)
	for err != nil && !failure.IsFatal(err) && time.Now().Before(deadline) {
		t.Logf("Resume: %v; trying again", err)
		err = s.Resume(t.Context(), h)
	}
	return err
}

// onTimeline1 is a database's WAL history on its first timeline, past
// every position of the tests.
var onTimeline1 = event.WALHistory{SystemID: "test", Timeline: 1, Flushed: 1 << 40}

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

// TestExactlyOnceHoldsNoMoreThanItsBuffers: in exactly-once mode an event
// is answered when its Kafka transaction commits, so the events Kafka has
// acknowledged and their transaction holds count against the buffers
// (MaxBufferedRecords) with those in flight: at most that many events are
// published and not yet answered, each held with its payload and record.
// A catch-up of 30,000 events, published as fast as Publish lets them in.
func TestExactlyOnceHoldsNoMoreThanItsBuffers(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := txnSink(t, kc, "walrelay-held")
	const n, buffered = 30000, 5000 // MaxBufferedRecords' default
	var open, most atomic.Int64
	answered := make(chan error, n)
	for i := range n {
		if o := open.Add(1); o > most.Load() {
			most.Store(o)
		}
		s.Publish(t.Context(), txnEvent(pglogrepl.LSN(0x1000+i/20), i%20), func(_ Delivery, err error) {
			open.Add(-1)
			answered <- err
		})
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
	t.Logf("at most %d events published and not yet answered", most.Load())
	if most.Load() > buffered+1 { // +1: the one Publish is letting in
		t.Fatalf("%d events published and not yet answered at once, want at most %d (MaxBufferedRecords): a transaction held the acknowledged ones beyond the buffers", most.Load(), buffered)
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
	err := resumeSettled(t, second, event.WALHistory{SystemID: "test", Timeline: 1, Flushed: 0x400})
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
			if err := s.Resume(t.Context(), onTimeline1); err == nil || failure.IsFatal(err) {
				t.Fatalf("Resume while the brokers are away: %v, want a retriable error", err)
			}
			kc.Up()
			deadline := time.Now().Add(30 * time.Second)
			for err := s.Resume(t.Context(), onTimeline1); err != nil; err = s.Resume(t.Context(), onTimeline1) {
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

// TestExactlyOnceAbortCutByAnOutage: a record of a transaction fails, and
// the abort that follows cannot reach the transaction coordinator (as when
// the coordinator is the broker a cluster change froze or cut off, and the
// sink fenced it: the nemesis's leader_frozen). The client still holds the
// transaction then. Once the coordinator is back, Resume ends it before
// anything more is produced: the next event is committed, and the process
// never has to restart. (Before, Resume left it open, and the next
// transaction failed fatally: "begin a kafka transaction: invalid attempt
// to begin a transaction while already in a transaction": walrelay
// stopped, and the slot's position with it.)
func TestExactlyOnceAbortCutByAnOutage(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := txnSink(t, kc, "walrelay-abort-cut", kgo.RetryTimeout(time.Second), kgo.RequestRetries(2))
	if err := publish(t, s, txnEvent(0x100, 0)); err != nil {
		t.Fatal(err)
	}
	// The next transaction's event is written, its position record is
	// refused (a failure that is not retried), and its abort finds the
	// coordinator away: the broker holds the transaction open, the event
	// in it.
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	md, err := kadm.NewClient(cl).Metadata(t.Context(), "walrelay.offsets")
	cl.Close()
	if err != nil {
		t.Fatal(err)
	}
	offsetsID := md.Topics["walrelay.offsets"].ID // requests name it by id from Produce v13 on
	var refused, cut atomic.Bool
	kc.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		pr := req.(*kmsg.ProduceRequest)
		if len(pr.Topics) != 1 || pr.Topics[0].Topic != "walrelay.offsets" && pr.Topics[0].TopicID != offsetsID || !refused.CompareAndSwap(false, true) {
			return nil, nil, false
		}
		resp := pr.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range pr.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.PolicyViolation.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	kc.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		if req.(*kmsg.EndTxnRequest).Commit || !cut.CompareAndSwap(false, true) {
			return nil, nil, false
		}
		kc.Down()
		return nil, errors.New("cut"), true
	})
	err = publish(t, s, txnEvent(0x200, 0))
	if err == nil || failure.IsFatal(err) {
		t.Fatalf("an event whose transaction's position record was refused: %v, want a retriable error", err)
	}
	if !refused.Load() || !cut.Load() {
		t.Fatalf("position refused %v, abort cut %v: want both", refused.Load(), cut.Load())
	}
	// As the relay does at the next session: Resume, retried while it
	// fails retriably (the coordinator still away, then back), then the
	// stream resends from its confirmed position.
	err = s.Resume(t.Context(), onTimeline1)
	t.Logf("Resume while the coordinator is away: %v", err)
	if failure.IsFatal(err) {
		t.Fatalf("Resume while the coordinator is away: %v, want nil or a retriable error", err)
	}
	kc.Up()
	deadline := time.Now().Add(30 * time.Second)
	for err := s.Resume(t.Context(), onTimeline1); err != nil; err = s.Resume(t.Context(), onTimeline1) {
		if failure.IsFatal(err) || time.Now().After(deadline) {
			t.Fatalf("Resume once the coordinator is back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, e := range []*event.Event{txnEvent(0x200, 0), txnEvent(0x300, 0)} {
		if err := publish(t, s, e); err != nil {
			t.Fatalf("publish %s after the coordinator came back: %v", e.ID, err)
		}
	}
	// The first attempt of 0/200#0, written in the transaction whose abort
	// was cut, was aborted by the broker (a read_committed reader is not
	// held up by it either): each event once.
	ids := readCommittedIDs(t, kc, 3)
	if got := strings.Join(ids, ","); got != "e-0/100-0,e-0/200-0,e-0/300-0" {
		t.Fatalf("read %s", got)
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
	before := s.q.Generation()
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

// TestExactlyOnceCatchUpCommitsWithinTheTimeout: with the longest
// transaction interval accepted (just under a quarter of a 4 s transaction
// timeout: 2 s left too little room on a loaded 2-core machine, where the
// broker aborted a commit that was late for want of CPU) and a catch-up of 100 KiB records to a broker that answers
// 20 ms late (a full round always waits behind the transaction), no transaction reaches the timeout: every event
// is committed, and the broker aborts none. (Before, a catch-up stretched a
// transaction to ten times the interval, 4.9 s, and the broker aborted it:
// the sink stopped, saying another instance had fenced it; ten times this
// interval is 9.9 s, past the timeout still.)
func TestExactlyOnceCatchUpCommitsWithinTheTimeout(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	var longest atomic.Int64
	tc := Transactions{ID: "walrelay-catchup", Key: "slot_a", Source: "db", Timeout: 4 * time.Second, Interval: 990 * time.Millisecond, MaxRecords: 1 << 30}
	var s *Sink // set before any event's transaction commits
	tc.OnCommit = func(_ event.Position, _ time.Duration) {
		// The flusher runs OnCommit: the age of the transaction it ended.
		longest.Store(max(longest.Load(), int64(time.Since(s.txnBegan()))))
	}
	s = txnSinkOf(t, kc, tc)
	kc.Slow(20 * time.Millisecond) // the broker takes its time: a full round always waits
	began := time.Now()
	payload := []byte(`{"pad":"` + strings.Repeat("x", 100<<10) + `"}`)
	errs := make(chan error, 1)
	var answered atomic.Int64
	n := 0
	for time.Since(began) < 6*time.Second {
		e := txnEvent(pglogrepl.LSN(0x100+n), 0)
		e.Payload = payload
		n++
		s.Publish(t.Context(), e, func(_ Delivery, err error) {
			answered.Add(1)
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for answered.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-errs:
		t.Fatalf("a catch-up of %d events: %v", n, err)
	default:
	}
	got := time.Duration(longest.Load())
	t.Logf("%d events of 100 KiB in %d transactions; the longest was open %s (timeout %s)", n, s.txnCounts().Commits, got.Round(time.Millisecond), tc.Timeout)
	// The broker (kfake enforces transaction.timeout.ms) aborting a
	// transaction fails its events above. The age measured here adds the
	// client's scheduling to the broker's, so on a loaded machine it can
	// pass the timeout with no abort: logged, not judged.
	if answered.Load() != int64(n) {
		t.Fatalf("%d of %d events answered; the longest transaction was open %s", answered.Load(), n, got)
	}
}

// TestExactlyOnceTimeoutIsToldFromAFence: the brokers are held without an
// answer (a network partition) for longer than the transaction timeout
// while a transaction is open; the broker aborts it. The sink stops with
// ErrTransactionTimedOut, which names the timeout, not ErrFenced.
func TestExactlyOnceTimeoutIsToldFromAFence(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := txnSinkOf(t, kc, Transactions{ID: "walrelay-timeout", Key: "slot_a", Source: "db", Timeout: 2 * time.Second, Interval: 100 * time.Millisecond})
	if err := publish(t, s, txnEvent(0x100, 0)); err != nil {
		t.Fatal(err)
	}
	kc.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		kc.DropControl()
		kc.Partition() // from the transaction's first record on
		return nil, nil, false
	})
	go func() {
		time.Sleep(4 * time.Second)
		kc.Up()
	}()
	err := publish(t, s, txnEvent(0x200, 0))
	t.Logf("a transaction held past its timeout: %v", err)
	if !errors.Is(err, ErrTransactionTimedOut) || errors.Is(err, ErrFenced) || !failure.IsFatal(err) || !strings.Contains(err.Error(), "kafka.transaction_timeout 2s") {
		t.Fatalf("got %v, want a fatal ErrTransactionTimedOut naming kafka.transaction_timeout", err)
	}
}

// TestExactlyOnceOtherTransactionalID: a sink of another transactional id
// than the one that committed the slot's position refuses to start, naming
// both (two ids never fence each other, so both could commit); with
// Takeover naming the old id it fences it, reads the position again and
// goes on, and the old instance can commit nothing more; the old id,
// started again, is refused in its turn.
func TestExactlyOnceOtherTransactionalID(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	a := txnSink(t, kc, "walrelay-pod-a")
	if err := publish(t, a, txnEvent(0x100, 0)); err != nil {
		t.Fatal(err)
	}

	b := newSink(t, kc, Config{Transactions: &Transactions{ID: "walrelay-pod-b", Key: "slot_a", Source: "db"}})
	err := resumeSettled(t, b, onTimeline1)
	t.Logf("another id: %v", err)
	if !errors.Is(err, ErrOtherTransactionalID) || !failure.IsFatal(err) || !strings.Contains(err.Error(), "walrelay-pod-a") || !strings.Contains(err.Error(), "walrelay-pod-b") {
		t.Fatalf("Resume of another id: %v, want a fatal ErrOtherTransactionalID naming both ids", err)
	}
	// a goes on: the refusal fenced nothing.
	if err := publish(t, a, txnEvent(0x200, 0)); err != nil {
		t.Fatalf("the instance of the committed id after a refused one: %v", err)
	}

	b = txnSinkOf(t, kc, Transactions{ID: "walrelay-pod-b", Key: "slot_a", Source: "db", Takeover: "walrelay-pod-a"})
	if got := b.Committed(); got != (event.Position{CommitLSN: 0x200}) {
		t.Fatalf("the takeover read %s, want 0/200#0", got)
	}
	if err := publish(t, a, txnEvent(0x300, 0)); !errors.Is(err, ErrFenced) {
		t.Fatalf("the instance taken over published: %v, want ErrFenced", err)
	}
	if err := publish(t, b, txnEvent(0x300, 0)); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(readCommittedIDs(t, kc, 3), ","); got != "e-0/100-0,e-0/200-0,e-0/300-0" {
		t.Fatalf("read %s", got)
	}

	a2 := newSink(t, kc, Config{Transactions: &Transactions{ID: "walrelay-pod-a", Key: "slot_a", Source: "db"}})
	if err := resumeSettled(t, a2, onTimeline1); !errors.Is(err, ErrOtherTransactionalID) || !strings.Contains(err.Error(), "walrelay-pod-b") {
		t.Fatalf("the old id after the takeover: %v, want ErrOtherTransactionalID naming walrelay-pod-b", err)
	}
}

// TestExactlyOnceTimelineHistory: a position committed on timeline 1 is
// checked against the history of the server a later session streams
// from. On WAL timeline 2 shares (before the switch) it is taken; at or
// past the switch, on a timeline not in the server's history, or on a
// later timeline than the server's, it is refused, naming the switch and
// kafka.accept_timeline; with AcceptTimeline naming the server's timeline
// it is carried to the switch, so that the new timeline's events from the
// switch on are published, and the positions committed then carry that
// timeline.
func TestExactlyOnceTimelineHistory(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	first := txnSink(t, kc, "walrelay-tl")
	if err := publish(t, first, txnEvent(0x500, 0)); err != nil {
		t.Fatal(err)
	}
	tl2 := func(end pglogrepl.LSN) event.WALHistory {
		return event.WALHistory{SystemID: "test", Timeline: 2, Flushed: 1 << 40, Ends: map[int32]pglogrepl.LSN{1: end}}
	}
	resume := func(tc Transactions, h event.WALHistory) (*Sink, error) {
		tc.ID, tc.Key, tc.Source = "walrelay-tl", "slot_a", "db"
		s := newSink(t, kc, Config{Transactions: &tc})
		return s, resumeSettled(t, s, h)
	}
	if _, err := resume(Transactions{}, tl2(0x508)); err != nil {
		t.Fatalf("a position before the switch: %v", err)
	}
	for _, bad := range []struct {
		name string
		h    event.WALHistory
		want string
	}{
		{"at the switch", tl2(0x500), "lies at or past the end of timeline 1 at 0/500"},
		{"past the switch", tl2(0x480), "set kafka.accept_timeline: 2 to publish this server's events from 0/480 on"},
		{"a timeline not in the history", event.WALHistory{SystemID: "test", Timeline: 3, Flushed: 1 << 40, Ends: map[int32]pglogrepl.LSN{2: 0x900}}, "committed on timeline 1, which is not in the history"},
	} {
		_, err := resume(Transactions{}, bad.h)
		t.Logf("%s: %v", bad.name, err)
		if !errors.Is(err, ErrWALHistory) || !failure.IsFatal(err) || !strings.Contains(err.Error(), bad.want) {
			t.Fatalf("%s: %v, want a fatal ErrWALHistory saying %q", bad.name, err, bad.want)
		}
	}

	s, err := resume(Transactions{AcceptTimeline: 2}, tl2(0x480))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Committed(); got != (event.Position{CommitLSN: 0x480, Index: -1}) {
		t.Fatalf("carried to %s, want 0/480#-1", got)
	}
	done := make(chan Delivery, 1)
	s.Publish(t.Context(), txnEvent(0x470, 0), func(d Delivery, err error) {
		if err != nil {
			t.Error(err)
		}
		done <- d
	})
	if d := <-done; !d.Skipped {
		t.Fatal("an event before the switch was produced again")
	}
	if err := publish(t, s, txnEvent(0x480, 0)); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(readCommittedIDs(t, kc, 2), ","); got != "e-0/500-0,e-0/480-0" {
		t.Fatalf("read %s", got)
	}
	// Committed on timeline 2 now: taken on timeline 2 without the key,
	// refused on timeline 1 (a server of the old history).
	if _, err := resume(Transactions{}, tl2(0x480)); err != nil {
		t.Fatalf("the position committed on timeline 2, on timeline 2: %v", err)
	}
	if _, err := resume(Transactions{}, onTimeline1); !errors.Is(err, ErrWALHistory) || !strings.Contains(err.Error(), "committed on timeline 2") {
		t.Fatalf("the position of timeline 2 on timeline 1: %v", err)
	}
}

// TestExactlyOnceStartReadsBackFromTheMarker: the committed position is
// read back from this start's marker in growing windows, not from the
// offsets topic's start. With 20,000 positions of the slot on the topic a
// start reads no more than the first window (under 1,000 records); with the slot's one
// position behind 20,000 of another slot it is still found, in a few
// windows; the position read is the latest.
func TestExactlyOnceStartReadsBackFromTheMarker(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	a := txnSink(t, kc, "walrelay-a")
	if err := publish(t, a, txnEvent(0x100, 0)); err != nil {
		t.Fatal(err)
	}
	a.Close()
	// Positions as the transactions of a long run leave them, produced
	// faster by a plain producer.
	positions := func(slot string, n int, lsn func(int) pglogrepl.LSN) {
		t.Helper()
		cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...), kgo.DefaultProduceTopic("walrelay.offsets"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		for i := range n {
			v := fmt.Sprintf(`{"slot":%q,"source":"db","commit_lsn":%q,"index":0,"transactional_id":"walrelay-a","committed_at":"2026-12-04T00:00:00Z"}`, slot, lsn(i))
			cl.Produce(t.Context(), &kgo.Record{Key: []byte(slot), Value: []byte(v)}, nil)
		}
		if err := cl.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	const n = 20000
	positions("slot_b", n, func(i int) pglogrepl.LSN { return pglogrepl.LSN(0x1000 + i) })
	b := txnSink(t, kc, "walrelay-a")
	if got := b.Committed(); got != (event.Position{CommitLSN: 0x100}) {
		t.Fatalf("behind %d positions of another slot: read %s, want 0/100#0", n, got)
	}
	// 256 + 1,024 + 4,096 + 16,384 offsets reach 20,000 back.
	if r := b.txnCounts().ReadLast; r < n || r > 2*n {
		t.Fatalf("behind %d positions of another slot: read %d records, want the windows that reach it", n, r)
	}
	t.Logf("the slot's position behind %d of another slot: %d records read", n, b.txnCounts().ReadLast)
	b.Close()

	positions("slot_a", n, func(i int) pglogrepl.LSN { return pglogrepl.LSN(0x200 + i) })
	c := txnSink(t, kc, "walrelay-a")
	if got, want := c.Committed(), (event.Position{CommitLSN: pglogrepl.LSN(0x200 + n - 1)}); got != want {
		t.Fatalf("after %d positions of the slot: read %s, want %s", n, got, want)
	}
	if r := c.txnCounts().ReadLast; r > 1000 {
		t.Fatalf("after %d positions of the slot: read %d records, want at most 1,000", n, r)
	}
	t.Logf("the slot's position after %d of its own: %d records read", n, c.txnCounts().ReadLast)
	if err := publish(t, c, txnEvent(0x200+n, 0)); err != nil {
		t.Fatal(err)
	}
}

// TestExactlyOnceTakeoverAcrossSystemIdentifiers: pg_upgrade gives the
// cluster a new system identifier (and so a new default transactional id)
// and starts its WAL past the old cluster's. A position of the old one is
// refused, naming the takeover of its writer; with the takeover it is
// taken over whatever timeline it was committed on (of the old cluster's
// history), but not if it lies beyond the new server's WAL.
func TestExactlyOnceTakeoverAcrossSystemIdentifiers(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	// The old cluster was on timeline 3 (it had been failed over).
	old := newSink(t, kc, Config{Transactions: &Transactions{ID: "walrelay-old-postgres-slot_a", Key: "slot_a", Source: "old/postgres"}})
	if err := old.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := resumeSettled(t, old, event.WALHistory{SystemID: "old", Timeline: 3, Flushed: 1 << 40, Ends: map[int32]pglogrepl.LSN{1: 0x100, 2: 0x200}}); err != nil {
		t.Fatal(err)
	}
	if err := publish(t, old, txnEvent(0x500, 0)); err != nil {
		t.Fatal(err)
	}
	upgraded := Transactions{ID: "walrelay-new-postgres-slot_a", Key: "slot_a", Source: "new/postgres"}
	b := newSink(t, kc, Config{Transactions: &upgraded})
	err := resumeSettled(t, b, onTimeline1)
	t.Logf("another system identifier: %v", err)
	if !failure.IsFatal(err) || !strings.Contains(err.Error(), "set kafka.transactional_id_takeover: walrelay-old-postgres-slot_a") {
		t.Fatalf("Resume on another system identifier: %v, want a fatal refusal naming the takeover", err)
	}
	upgraded.Takeover = "walrelay-old-postgres-slot_a"
	beyond := newSink(t, kc, Config{Transactions: &upgraded})
	if err := resumeSettled(t, beyond, event.WALHistory{SystemID: "new", Timeline: 1, Flushed: 0x400}); !errors.Is(err, ErrWALHistory) {
		t.Fatalf("the takeover of a position beyond the new server's WAL: %v, want ErrWALHistory", err)
	}
	// The new cluster is on timeline 1 whatever the old one's was.
	s := txnSinkOf(t, kc, upgraded)
	if got := s.Committed(); got != (event.Position{CommitLSN: 0x500}) {
		t.Fatalf("the takeover read %s, want 0/500#0", got)
	}
	if err := publish(t, s, txnEvent(0x900, 0)); err != nil {
		t.Fatal(err)
	}
	if err := publish(t, old, txnEvent(0x600, 0)); !errors.Is(err, ErrFenced) {
		t.Fatalf("the old id after the takeover published: %v, want ErrFenced", err)
	}
	if got := strings.Join(readCommittedIDs(t, kc, 2), ","); got != "e-0/500-0,e-0/900-0" {
		t.Fatalf("read %s", got)
	}

	// A kafka.transactional_id set by hand does not change with the
	// system identifier: the takeover names that id itself.
	pinned := Transactions{ID: "walrelay-pinned", Key: "slot_b", Source: "old/postgres"}
	if err := publish(t, txnSinkOf(t, kc, pinned), txnEvent(0x700, 0)); err != nil {
		t.Fatal(err)
	}
	pinned.Source = "new/postgres"
	if err := resumeSettled(t, newSink(t, kc, Config{Transactions: &pinned}), onTimeline1); !failure.IsFatal(err) || !strings.Contains(err.Error(), "set kafka.transactional_id_takeover: walrelay-pinned") {
		t.Fatalf("Resume of a pinned id on another system identifier: %v, want a fatal refusal naming the takeover of the id itself", err)
	}
	pinned.Takeover = pinned.ID
	if got := txnSinkOf(t, kc, pinned).Committed(); got != (event.Position{CommitLSN: 0x700}) {
		t.Fatalf("the takeover of the pinned id read %s, want 0/700#0", got)
	}
}
