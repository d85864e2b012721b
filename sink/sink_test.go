package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
)

func newSink(t *testing.T, kc *kafkatest.Cluster, cfg Config) *Sink {
	t.Helper()
	cfg.Brokers = kc.Addrs()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// publish publishes e and waits for its fate.
func publish(t *testing.T, s *Sink, e *event.Event) error {
	t.Helper()
	done := make(chan error, 1)
	s.Publish(t.Context(), e, func(_ Delivery, err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("no ack within 30s")
		return nil
	}
}

func newEvent(id string) *event.Event {
	return &event.Event{ID: id, AggregateType: "order", AggregateID: "o-1", Type: "Created", Payload: []byte(`{"a":1}`),
		Headers: []event.Header{{Key: "tenant", Value: []byte("7")}}, Source: "public.outbox", Xid: 12, CommitLSN: 0x1234,
		CommitTime: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC), Transactional: true}
}

func TestRecordLayout(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := newSink(t, kc, Config{Topic: "events.{aggregatetype}.{type}"})
	if err := publish(t, s, newEvent("e1")); err != nil {
		t.Fatal(err)
	}
	col, err := kafkatest.Collect(kc.Addrs(), `events\..*`)
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) == 1 })
	if err != nil {
		t.Fatal(err)
	}
	r := recs[0]
	if r.Topic != "events.order.Created" || string(r.Key) != "o-1" || string(r.Value) != `{"a":1}` {
		t.Fatalf("record %s key %q value %q", r.Topic, r.Key, r.Value)
	}
	want := map[string]string{"id": "e1", "type": "Created", "walrelay.lsn": "0/1234", "walrelay.xid": "12",
		"walrelay.commit_time": "2026-01-02T03:04:05.000006Z", "tenant": "7"}
	for k, v := range want {
		if got := string(kafkatest.Header(r, k)); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
}

func TestTombstone(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := newSink(t, kc, Config{})
	e := newEvent("e2")
	e.Payload = nil
	if err := publish(t, s, e); err != nil {
		t.Fatal(err)
	}
	col, _ := kafkatest.Collect(kc.Addrs(), `outbox\.event\.order`)
	defer col.Close()
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) == 1 })
	if err != nil {
		t.Fatal(err)
	}
	if recs[0].Value != nil {
		t.Fatalf("tombstone has value %q", recs[0].Value)
	}
}

func TestInvalidTopicIsDeadLettered(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := newSink(t, kc, Config{})
	e := newEvent("e3")
	e.AggregateType = "has space"
	if err := publish(t, s, e); err != nil {
		t.Fatal(err)
	}
	col, _ := kafkatest.Collect(kc.Addrs(), `walrelay\.dlq`)
	defer col.Close()
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) == 1 })
	if err != nil {
		t.Fatal(err)
	}
	if got := string(kafkatest.Header(recs[0], HeaderReason)); got != "invalid_topic" {
		t.Fatalf("reason %q", got)
	}
}

// TestUnwritableDeadLetterTopicFails: when the dead-letter topic refuses the
// record too, the event's callback gets an error (the pipeline stops) rather
// than a silent drop.
func TestUnwritableDeadLetterTopicFails(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	kc.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		// The only record produced here is the dead-letter one: refuse every
		// produce.
		return kafkatest.RefuseProduce(req.(*kmsg.ProduceRequest), kerr.TopicAuthorizationFailed.Code), nil, true
	})
	s := newSink(t, kc, Config{})
	e := newEvent("e4")
	e.Invalid = errors.New("column aggregateid is NULL")
	err := publish(t, s, e)
	if !errors.Is(err, kerr.TopicAuthorizationFailed) || !strings.Contains(err.Error(), "dead-letter event e4") {
		t.Fatalf("err = %v, want a dead-letter failure wrapping TOPIC_AUTHORIZATION_FAILED", err)
	}
	if !failure.IsFatal(err) {
		t.Fatalf("err is %v, want fatal: authorization is not fixed by retrying", failure.Of(err))
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]Config{
		"no brokers":  {},
		"bad dlq":     {Brokers: []string{"x:1"}, DLQTopic: "a b"},
		"bad tmpl":    {Brokers: []string{"x:1"}, Topic: "x.{unknown}"},
		"compression": {Brokers: []string{"x:1"}, Compression: "brotli"},
		"buffers":     {Brokers: []string{"x:1"}, MaxBufferedBytes: 10, BatchMaxBytes: 100},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestLz4CompressorRoundTrip: batches larger than one 64 KiB block come
// back whole through a standard lz4 frame reader.
func TestLz4CompressorRoundTrip(t *testing.T) {
	t.Parallel()
	c := newLz4Compressor()
	src := bytes.Repeat([]byte(`{"pad": "xyz", "n": 12345}`), 20000) // 520 KB
	for range 2 {                                                    // the second time from the pool
		out, codec := c.Compress(new(bytes.Buffer), src)
		if codec != kgo.CodecLz4 || len(out) == 0 || len(out) >= len(src) {
			t.Fatalf("codec %d, %d bytes from %d", codec, len(out), len(src))
		}
		back, err := io.ReadAll(lz4.NewReader(bytes.NewReader(out)))
		if err != nil || !bytes.Equal(back, src) {
			t.Fatalf("round trip: %v, %d bytes back of %d", err, len(back), len(src))
		}
	}
}

// TestRefusedBatchIsTransient: the broker refusing a small record's batch as
// too large is a failure to retry, not a reason to dead-letter the record;
// after Abort the topic's cap is learnt again, and halved when the broker's
// limit cannot be read any lower.
func TestRefusedBatchIsTransient(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := newSink(t, kc, Config{})
	if err := publish(t, s, newEvent("warm")); err != nil {
		t.Fatal(err)
	}
	before := s.batchCapOf("outbox.event.order")
	refusals := 1
	kc.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if refusals == 0 {
			return nil, nil, false
		}
		refusals--
		return kafkatest.RefuseProduce(req.(*kmsg.ProduceRequest), kerr.MessageTooLarge.Code), nil, true
	})
	err := publish(t, s, newEvent("small"))
	if !errors.Is(err, kerr.MessageTooLarge) || !strings.Contains(err.Error(), "refused its batch") {
		t.Fatalf("err = %v, want the broker's refusal of the batch", err)
	}
	// MESSAGE_TOO_LARGE is a per-event code, but a refused batch is not
	// this event's fault: it is sent again.
	if !failure.IsRetriable(err) {
		t.Fatalf("err is %v, want retriable", failure.Of(err))
	}
	if err := s.Abort(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := publish(t, s, newEvent("again")); err != nil {
		t.Fatalf("after Abort: %v", err)
	}
	if got := s.batchCapOf("outbox.event.order"); got != before/2 {
		t.Fatalf("batch cap %d after the refusal, want %d (half of %d: kfake's limit is not lower)", got, before/2, before)
	}
	big := newEvent("big")
	big.Payload = bytes.Repeat([]byte("x"), int(before/2))
	if err := publish(t, s, big); err != nil {
		t.Fatalf("a record over the new cap: %v, want it dead-lettered", err)
	}
	col, _ := kafkatest.Collect(kc.Addrs(), `walrelay\.dlq`)
	defer col.Close()
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) == 1 })
	if err != nil {
		t.Fatal(err)
	}
	if id := string(kafkatest.Header(recs[0], "id")); id != "big" {
		t.Fatalf("dead-lettered %q, want only big", id)
	}
}

// TestAbortWithRecordsInFlight: Abort returns once the records in flight
// are answered, and their callbacks run meanwhile. (Abort once held the
// lanes' lock while it waited for the lanes' clients, and the callbacks
// that answer the records take that lock: Abort waited for ever.)
func TestAbortWithRecordsInFlight(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := newSink(t, kc, Config{Linger: time.Millisecond})
	if err := publish(t, s, newEvent("warm")); err != nil {
		t.Fatal(err)
	}
	kc.Slow(300 * time.Millisecond)
	done := make(chan error, 1)
	s.Publish(t.Context(), newEvent("late"), func(_ Delivery, err error) { done <- err })
	time.Sleep(100 * time.Millisecond) // in flight, answered 300 ms late
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := s.Abort(ctx); err != nil {
		t.Fatalf("Abort with a record in flight: %v", err)
	}
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, ErrNotSent) && !errors.Is(err, kgo.ErrAborting) {
			t.Fatalf("the record in flight: %v, want it acked, aborted or not sent", err)
		}
	default:
		t.Fatal("Abort returned before the record in flight was answered")
	}
	kc.Up()
	if err := publish(t, s, newEvent("after")); err != nil {
		t.Fatalf("after Abort: %v", err)
	}
}

// TestNothingOvertakesAFailedRecord: once a record fails, nothing published
// after it is sent until Abort, however late the failed record's callback
// runs. The client fails a partition's records at once but reports it on its
// callback goroutine, which may be busy: a record produced meanwhile must not
// be written ahead of the failed one, which the caller publishes again.
func TestNothingOvertakesAFailedRecord(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	hold := &slowFailure{failing: make(chan struct{})}
	s := newSink(t, kc, Config{Linger: time.Millisecond, Opts: []kgo.Opt{kgo.WithHooks(hold)}})
	if err := publish(t, s, newEvent("warm")); err != nil {
		t.Fatal(err)
	}
	kc.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		return kafkatest.RefuseProduce(req.(*kmsg.ProduceRequest), kerr.UnknownServerError.Code), nil, true
	})
	failed := make(chan error, 1)
	s.Publish(t.Context(), newEvent("first"), func(_ Delivery, err error) { failed <- err })
	// The later records are published in the window: the client has failed
	// first, and its callback is held. (Published earlier, they could share
	// first's batch, and fail with it, if the flusher took them together.)
	<-hold.failing
	var written atomic.Int32
	var answered sync.WaitGroup
	for i := range 20 {
		answered.Add(1)
		s.Publish(t.Context(), newEvent(fmt.Sprint("later-", i)), func(_ Delivery, err error) {
			defer answered.Done()
			switch {
			case err == nil:
				written.Add(1)
			case !errors.Is(err, ErrNotSent) || errors.Is(err, kerr.UnknownServerError):
				// The cause must not be matched: a record not sent
				// would be handled as if it had failed itself.
				t.Errorf("later-%d: %v, want ErrNotSent alone", i, err)
			}
		})
	}
	if err := <-failed; !errors.Is(err, kerr.UnknownServerError) {
		t.Fatalf("first: %v, want UNKNOWN_SERVER_ERROR", err)
	}
	answered.Wait()
	if n := written.Load(); n != 0 {
		t.Fatalf("%d of 20 records published after a failed one were written ahead of it", n)
	}
	if err := s.Abort(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"first", "later-0"} {
		if err := publish(t, s, newEvent(id)); err != nil {
			t.Fatalf("%s after Abort: %v", id, err)
		}
	}
	if got := topicIDs(t, kc, 3); got != "warm,first,later-0" {
		t.Fatalf("topic holds %s, want warm,first,later-0", got)
	}
}

// slowFailure holds the client's callback goroutine for 300 ms before a
// failed record's callback runs, as a goroutine busy with many callbacks
// would; failing is closed when that hold begins.
type slowFailure struct {
	once    sync.Once
	failing chan struct{}
}

func (h *slowFailure) OnProduceRecordUnbuffered(_ *kgo.Record, err error) {
	if err != nil {
		h.once.Do(func() { close(h.failing) })
		time.Sleep(300 * time.Millisecond)
	}
}

// TestCloseAnswersEveryRecord: records in flight and records queued behind
// them when the sink closes are all failed, none dropped without an answer.
func TestCloseAnswersEveryRecord(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s, err := New(Config{Brokers: kc.Addrs(), MaxBufferedRecords: 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := publish(t, s, newEvent("warm")); err != nil {
		t.Fatal(err)
	}
	kc.Partition() // requests go out and are never answered
	const n = 30   // more than the queue holds: Publish blocks for the last ones
	var answered, failed atomic.Int32
	go func() {
		for i := range n {
			s.Publish(t.Context(), newEvent(fmt.Sprint("e", i)), func(_ Delivery, err error) {
				if err != nil {
					failed.Add(1)
				}
				answered.Add(1)
			})
		}
	}()
	waitfor.Until(t, 30*time.Second, "a full queue behind the round in flight", func() bool { return s.queued() >= s.q.MaxRecords() })
	s.Close()
	waitfor.Until(t, 30*time.Second, "every record answered after Close", func() bool { return answered.Load() == n })
	if a, f := answered.Load(), failed.Load(); a != n || f != n {
		t.Fatalf("%d of %d records answered, %d failed, after Close; want all answered and failed", a, n, f)
	}
}

// topicIDs waits for n records on outbox.event.order and returns their ids
// in order, comma-separated.
func topicIDs(t *testing.T, kc *kafkatest.Cluster, n int) string {
	t.Helper()
	col, err := kafkatest.Collect(kc.Addrs(), `outbox\.event\.order`)
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) >= n })
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range recs {
		ids = append(ids, string(kafkatest.Header(r, "id")))
	}
	return strings.Join(ids, ",")
}

// queued returns how many records wait for a round.
func (s *Sink) queued() int {
	return s.q.Len()
}

// TestRefusedBatchFindsItsRecord: the broker refuses a whole batch for one
// record in it (INVALID_RECORD, CORRUPT_MESSAGE, INVALID_TOPIC_EXCEPTION),
// and the client fails every record of the partition with that error. None
// of them is dead-lettered for it: they fail as transient, and once sent
// again, each alone, only the record the broker refuses alone is
// dead-lettered; the others reach their topic in order.
func TestRefusedBatchFindsItsRecord(t *testing.T) {
	t.Parallel()
	for _, code := range []*kerr.Error{kerr.InvalidRecord, kerr.CorruptMessage, kerr.InvalidTopicException} {
		t.Run(code.Message, func(t *testing.T) {
			t.Parallel()
			kc := kafkatest.Start(t)
			s := newSink(t, kc, Config{Compression: "none", Linger: 50 * time.Millisecond})
			if err := publish(t, s, newEvent("warm")); err != nil {
				t.Fatal(err)
			}
			kc.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
				kc.KeepControl()
				pr := req.(*kmsg.ProduceRequest)
				for _, tp := range pr.Topics {
					for _, p := range tp.Partitions {
						// (The dead-letter record, with its error header,
						// passes: the topic may be named by id alone.)
						if bytes.Contains(p.Records, []byte("POISON")) && !bytes.Contains(p.Records, []byte(HeaderError)) {
							return kafkatest.RefuseProduce(pr, code.Code), nil, true
						}
					}
				}
				return nil, nil, false
			})
			events := func() []*event.Event {
				var es []*event.Event
				for i, id := range []string{"a", "bad", "c"} {
					e := newEvent(id)
					e.WALStart = pglogrepl.LSN(0x100 + i)
					if id == "bad" {
						e.Payload = []byte(`"POISON"`)
					}
					es = append(es, e)
				}
				return es
			}
			// One round: the three share a batch, and all fail.
			errs := make(chan error, 3)
			for _, e := range events() {
				s.Publish(t.Context(), e, func(_ Delivery, err error) { errs <- err })
			}
			for range 3 {
				if err := <-errs; !errors.Is(err, code) || !strings.Contains(err.Error(), "sent again alone") {
					t.Fatalf("err = %v, want the batch's refusal, to be sent again", err)
				}
			}
			if err := s.Abort(t.Context()); err != nil {
				t.Fatal(err)
			}
			// Sent again, as the stream would: each alone.
			dead := map[string]string{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for _, e := range events() {
				wg.Add(1)
				s.Publish(t.Context(), e, func(d Delivery, err error) {
					defer wg.Done()
					if err != nil {
						t.Errorf("%s sent again: %v", e.ID, err)
					}
					mu.Lock()
					dead[e.ID] = d.DeadLetter
					mu.Unlock()
				})
			}
			wg.Wait()
			if dead["a"] != "" || dead["c"] != "" || dead["bad"] != "invalid_record" && dead["bad"] != "invalid_topic" {
				t.Fatalf("dead-letter reasons %v, want only bad's", dead)
			}
			if got := topicIDs(t, kc, 3); got != "warm,a,c" {
				t.Fatalf("topic holds %s, want warm,a,c", got)
			}
		})
	}
}

// TestDataLossRestarts: the broker answers OUT_OF_ORDER_SEQUENCE_NUMBER (it
// may have lost records it had acknowledged). The client goes on with a new
// producer id; the sink counts it and fails what comes next unsent, so that
// the caller restarts from its confirmed position, and sends again after
// Abort.
func TestDataLossRestarts(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := newSink(t, kc, Config{})
	if err := publish(t, s, newEvent("warm")); err != nil {
		t.Fatal(err)
	}
	kc.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		return kafkatest.RefuseProduce(req.(*kmsg.ProduceRequest), kerr.OutOfOrderSequenceNumber.Code), nil, true
	})
	if err := publish(t, s, newEvent("retried")); err != nil {
		t.Fatalf("the record of the refused request: %v (the client retries it under a new producer id)", err)
	}
	waitfor.Until(t, 30*time.Second, "the data loss to be counted", func() bool { return s.DataLosses() == 1 })
	if err := publish(t, s, newEvent("next")); !errors.Is(err, ErrNotSent) || !strings.Contains(err.Error(), "may have lost") {
		t.Fatalf("after the data loss: %v, want it failed unsent for a restart", err)
	}
	if err := s.Abort(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := publish(t, s, newEvent("next")); err != nil {
		t.Fatalf("after Abort: %v", err)
	}
}
