package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/deadletter"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/sink/produce"
	"github.com/walrelay/walrelay/sink/record"
)

// TestBatchCapLearntAgainKeepsOneBatch: a client keeps the batch cap it
// asked for when it first loaded a partition (ProducerBatchMaxBytesFn), so a
// round measures a partition's records by the smallest cap a client was
// given (roundCapOf), not by the cap the sink knows now: else it hands the
// client more than one of the client's batches between flushes, and the
// partition's records go in several produce requests in flight at once.
// They differ when the sink forgets a topic (past 4096 topics) and learns
// it again after its max.message.bytes was raised: here the topic's cap is
// 16 KiB when the lane's client loads it, and 256 KiB when it is learnt
// again.
func TestBatchCapLearntAgainKeepsOneBatch(t *testing.T) {
	t.Parallel()
	for _, exactlyOnce := range []bool{false, true} {
		t.Run(fmt.Sprint("exactly_once=", exactlyOnce), func(t *testing.T) {
			t.Parallel()
			batchCapRelearnt(t, exactlyOnce)
		})
	}
}

func batchCapRelearnt(t *testing.T, exactlyOnce bool) {
	const topic, n = "outbox.event.order", 400
	kc := kafkatest.Start(t, kfake.SeedTopics(1, topic))
	h := &inflightHook{}
	cfg := Config{BatchMaxBytes: 256 << 10, MaxBufferedBytes: 8 << 20, MaxBufferedRecords: 100000, ProducerOpts: []kgo.Opt{kgo.WithHooks(h)}}
	if exactlyOnce {
		cfg.Transactions = &Transactions{ID: "walrelay-probe-cap", Key: "slot_a", Source: "db"}
	}
	s := newSink(t, kc, cfg)
	if exactlyOnce {
		startTxn(t, s)
	}
	// The topic's max.message.bytes is 16 KiB when the sink learns it.
	s.topics.Store(topic, topicInfo{valid: true, batchCap: 16 << 10})
	s.topicsN.Add(1)
	for _, id := range []string{"warm0", "warm1"} { // the lane of no broker's client, then broker 0's
		if err := publish(t, s, newEvent(id)); err != nil {
			t.Fatal(err)
		}
	}
	// Forgotten (4096 other topics came by) and learnt again after the
	// operator raised max.message.bytes: the lanes' clients keep 16 KiB.
	s.topics.Store(topic, topicInfo{valid: true, batchCap: 256 << 10})
	_, most := publishSlowed(t, s, kc, h, n)
	if most > 1 {
		t.Fatalf("one partition's records went in %d produce requests in flight at once: the lane counted batches of 256 KiB, its client cut them at 16 KiB", most)
	}
}

// TestProbeRelayUnderChurn runs the sink as the relay does (events in
// order, a window in flight; at a failure: wait, Abort, publish again from
// the first failed event) while, at once, idle lanes are retired as if
// their brokers left and came back, the sink breaks at random moments (as
// at a record's failure, racing the lanes' rounds), and the topic gains
// partitions (6 -> 12) with one lane's client refreshed first.
// (Abort at random moments is replaced by the sink broken at random
// moments: see relayUnderChurn.) Judged from
// the topic: per key, in each partition, events in increasing order; a key
// in at most two partitions, every event in the first before every one in

// TestProduceRequestHoldsOneBatch: a produce request holds about one
// batch (BatchMaxBytes and the request's own fields), not one batch of
// every partition of the broker: the client encodes each request into a
// buffer of its size, grown by doubling, and after a collection empties
// its pool, grows one again for each request; with 64 KiB payloads that
// compression does not shrink, four partitions' batches of 1 MB made
// requests of 4 MB, and the buffers and their growth were a quarter of
// walrelay's heap and a third of its CPU under the default soft memory
// limit (docs/benchmarks.md).
func TestProduceRequestHoldsOneBatch(t *testing.T) {
	t.Parallel()
	for _, exactlyOnce := range []bool{false, true} {
		t.Run(fmt.Sprint("exactly_once=", exactlyOnce), func(t *testing.T) {
			t.Parallel()
			const topic, batch = "outbox.event.order", 128 << 10
			kc := kafkatest.Start(t, kfake.SeedTopics(4, topic))
			h := &inflightHook{}
			cfg := Config{BatchMaxBytes: batch, MaxBufferedBytes: 8 << 20, Compression: "none", ProducerOpts: []kgo.Opt{kgo.WithHooks(h)}}
			if exactlyOnce {
				cfg.Transactions = &Transactions{ID: "walrelay-probe-request", Key: "slot_a", Source: "db"}
			}
			s := newSink(t, kc, cfg)
			if exactlyOnce {
				startTxn(t, s)
			}
			publishSlowedOf(t, s, kc, h, 400, 16<<10, 16)
			h.mu.Lock()
			defer h.mu.Unlock()
			t.Logf("largest produce request %d bytes (batches of %d)", h.largest, batch)
			if h.largest > int(produce.RequestCap(batch)) {
				t.Fatalf("a produce request of %d bytes, over %d: it held the batches of several partitions", h.largest, produce.RequestCap(batch))
			}
		})
	}
}

// TestDeadLetterOfKeyOrHeadersOverTheCap: an event whose key or headers
// alone are over the topic's batch cap (a wide aggregate id or header
// column, which postgres.max_message_bytes lets through) is dead-lettered
// too_large; its dead letter used to carry the same key and headers, over
// the dead-letter topic's cap too, so the client refused it, retriably,
// and the relay restarted on the event for ever, in both modes (the
// review's TestProbe44DeadLetterOfLargeHeaders). The dead letter goes
// without its value and without the key and event headers over the cap,
// with the id, walrelay's headers and HeaderKeyHeadersOmitted, and the
// stream moves on.
func TestDeadLetterOfKeyOrHeadersOverTheCap(t *testing.T) {
	t.Parallel()
	const batch = 64 << 10
	wide := bytes.Repeat([]byte("w"), 2*batch)
	for _, exactlyOnce := range []bool{false, true} {
		for _, c := range []struct {
			name string
			set  func(e *event.Event)
		}{
			{"header", func(e *event.Event) { e.Headers = append(e.Headers, event.Header{Key: "trace", Value: wide}) }},
			{"key", func(e *event.Event) { e.AggregateID = string(wide) }},
		} {
			t.Run(fmt.Sprintf("%s exactly_once=%v", c.name, exactlyOnce), func(t *testing.T) {
				t.Parallel()
				kc := kafkatest.Start(t)
				cfg := Config{BatchMaxBytes: batch}
				if exactlyOnce {
					cfg.Transactions = &Transactions{ID: "walrelay-wide-" + c.name, Key: "slot_a", Source: "db"}
				}
				s := newSink(t, kc, cfg)
				if exactlyOnce {
					startTxn(t, s)
				}
				e := newEvent("wide")
				c.set(e)
				if err := publish(t, s, e); err != nil {
					t.Fatalf("an event whose %s is over the batch cap: %v (retriable %v): its dead letter failed, and the relay restarts on it for ever", c.name, err, failure.IsRetriable(err))
				}
				next := newEvent("next")
				next.CommitLSN++
				if err := publish(t, s, next); err != nil {
					t.Fatalf("the event after it: %v", err)
				}
				col, _ := kafkatest.Collect(kc.Addrs(), `walrelay\.dlq|outbox\.event\.order`)
				defer col.Close()
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				recs, err := col.Wait(ctx, func(r []*kgo.Record) bool { return len(r) >= 2 })
				if err != nil {
					t.Fatalf("records: %d: %v", len(recs), err)
				}
				var dl *kgo.Record
				for _, r := range recs {
					switch {
					case r.Topic == "walrelay.dlq":
						dl = r
					case Header(r, record.HeaderID) != "next":
						t.Errorf("on %s: %q", r.Topic, Header(r, record.HeaderID))
					}
				}
				if dl == nil {
					t.Fatal("no dead letter")
				}
				if Header(dl, record.HeaderID) != "wide" || Header(dl, HeaderReason) != "too_large" || Header(dl, HeaderWALStart) == "" || Header(dl, HeaderError) == "" {
					t.Errorf("dead letter id %q reason %q wal_start %q error %q: want the id, too_large, the position and the error", Header(dl, record.HeaderID), Header(dl, HeaderReason), Header(dl, HeaderWALStart), Header(dl, HeaderError))
				}
				if produce.RecordSize(dl) > batch {
					t.Errorf("the dead letter holds %d bytes, over the cap %d", produce.RecordSize(dl), batch)
				}
				want := fmt.Sprint(len(wide)) // the key's bytes
				if c.name == "header" {
					want = fmt.Sprint(len("trace") + len(wide)) // the header's name and value
				}
				if got := Header(dl, HeaderKeyHeadersOmitted); got != want {
					t.Errorf("%s: %q; want %s", HeaderKeyHeadersOmitted, got, want)
				}
				if Header(dl, "tenant") != "7" || Header(dl, "type") != "Created" {
					t.Errorf("the small headers (tenant %q, type %q) left out too", Header(dl, "tenant"), Header(dl, "type"))
				}
				if c.name == "header" && (Header(dl, "trace") != "" || string(dl.Key) != "o-1") {
					t.Errorf("the dead letter's key %q, trace header %d bytes: want the key kept and the header left out", dl.Key, len(Header(dl, "trace")))
				}
				if c.name == "key" && dl.Key != nil {
					t.Errorf("the dead letter's key has %d bytes: want it left out", len(dl.Key))
				}
			})
		}
	}
}

// TestDeadLetterOfOwnHeadersOverTheCap: the dead-letter headers walrelay
// adds and the id were never left out of a dead letter. With the default
// route outbox.event.{aggregatetype}, an aggregate type of 64 KiB (the
// batch cap) is dead-lettered invalid_topic with the topic in
// walrelay.topic and, quoted, in walrelay.error; an event id of 64 KiB
// is over the cap by itself; the poll source's DeadLetter carries the
// error of the row's last attempt, which may be as long. The client
// refused each dead letter, retriably: before, "dead-letter event … to
// walrelay.dlq (retriable true)" in all of them, in both modes (the
// review's TestProbe45DeadLetterOwnHeadersOverTheCap), and the relay
// restarted on the row for ever. Now the error and the topic are clipped
// to deadletter.MaxText bytes, ending in "…" and their length, and an id
// over the cap keeps the longest prefix that fits, with
// walrelay.id_omitted_bytes, once the key and the event's headers are
// left out.
func TestDeadLetterOfOwnHeadersOverTheCap(t *testing.T) {
	t.Parallel()
	const batch = 64 << 10
	wide := strings.Repeat("w", batch)
	for _, exactlyOnce := range []bool{false, true} {
		for _, c := range []struct {
			name   string
			set    func(e *event.Event)
			reason string
		}{
			{"aggregatetype", func(e *event.Event) { e.AggregateType = wide }, "invalid_topic"},
			{"id", func(e *event.Event) { e.ID = wide; e.Invalid = errors.New("an invalid event") }, "invalid_event"},
			{"error", nil, "max_attempts"},
		} {
			t.Run(fmt.Sprintf("%s exactly_once=%v", c.name, exactlyOnce), func(t *testing.T) {
				t.Parallel()
				kc := kafkatest.Start(t)
				cfg := Config{BatchMaxBytes: batch}
				if exactlyOnce {
					cfg.Transactions = &Transactions{ID: "walrelay-own-" + c.name, Key: "slot_a", Source: "db"}
				}
				s := newSink(t, kc, cfg)
				if exactlyOnce {
					startTxn(t, s)
				}
				e := newEvent("wide")
				var err error
				if c.set != nil {
					c.set(e)
					err = publish(t, s, e)
				} else {
					// As the poll source dead-letters a row that failed
					// too many times, with its last error.
					done := make(chan error, 1)
					s.DeadLetter(t.Context(), e, c.reason, errors.New("attempt 5: "+wide+wide), func(_ Delivery, err error) { done <- err })
					err = <-done
				}
				if err != nil {
					t.Fatalf("the dead letter of an event whose %s is wide (the cap %d): %.200v (retriable %v): the relay restarts on it for ever", c.name, batch, err, failure.IsRetriable(err))
				}
				next := newEvent("next")
				next.CommitLSN++
				if err := publish(t, s, next); err != nil {
					t.Fatalf("the event after it: %v", err)
				}
				col, _ := kafkatest.Collect(kc.Addrs(), `walrelay\.dlq`)
				defer col.Close()
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				recs, err := col.Wait(ctx, func(r []*kgo.Record) bool { return len(r) >= 1 })
				if err != nil {
					t.Fatalf("records: %d: %v", len(recs), err)
				}
				dl := recs[0]
				if got := Header(dl, HeaderReason); got != c.reason {
					t.Errorf("reason %q, want %s", got, c.reason)
				}
				if size := produce.RecordSize(dl); size > batch {
					t.Errorf("the dead letter holds %d bytes, over the cap %d", size, batch)
				}
				for _, h := range []string{HeaderError, HeaderTopic} {
					if v := Header(dl, h); len(v) > deadletter.MaxText {
						t.Errorf("%s has %d bytes, over %d", h, len(v), deadletter.MaxText)
					}
				}
				id, cut := Header(dl, record.HeaderID), Header(dl, HeaderIDOmitted)
				switch c.name {
				case "id":
					if !strings.HasPrefix(e.ID, id) || cut != fmt.Sprint(len(e.ID)-len(id)) || len(id) < batch-4096 {
						t.Errorf("id of %d bytes, %s %q: want the longest prefix that fits (over %d bytes) and the bytes cut", len(id), HeaderIDOmitted, cut, batch-4096)
					}
					if dl.Key != nil || Header(dl, "tenant") != "" || Header(dl, HeaderKeyHeadersOmitted) == "" {
						t.Errorf("key %q, tenant %q, %s %q: want the key and the event's headers left out before the id is cut", dl.Key, Header(dl, "tenant"), HeaderKeyHeadersOmitted, Header(dl, HeaderKeyHeadersOmitted))
					}
				default:
					if id != "wide" || cut != "" || string(dl.Key) != "o-1" || Header(dl, "tenant") != "7" || string(dl.Value) != string(e.Payload) {
						t.Errorf("id %q (%s %q), key %q, tenant %q, value %q: want them whole", id, HeaderIDOmitted, cut, dl.Key, Header(dl, "tenant"), dl.Value)
					}
				}
				switch c.name {
				case "aggregatetype":
					topic := "outbox.event." + wide
					if got, want := Header(dl, HeaderTopic), fmt.Sprintf("… (%d bytes)", len(topic)); !strings.HasSuffix(got, want) || !strings.HasPrefix(topic, strings.TrimSuffix(got, want)) {
						t.Errorf("%s %.60q…: want the topic's prefix ending in %q", HeaderTopic, got, want)
					}
				case "error":
					if got := Header(dl, HeaderError); !strings.HasPrefix(got, "attempt 5: www") || !strings.HasSuffix(got, fmt.Sprintf("… (%d bytes)", len("attempt 5: ")+2*batch)) {
						t.Errorf("%s %.60q…: want the error's prefix and its length", HeaderError, got)
					}
				}
			})
		}
	}
}
