package sink

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// publishDelivery publishes e and returns where it went.
func publishDelivery(t *testing.T, s *Sink, e *event.Event) Delivery {
	t.Helper()
	type fate struct {
		d   Delivery
		err error
	}
	done := make(chan fate, 1)
	s.Publish(t.Context(), e, func(d Delivery, err error) { done <- fate{d, err} })
	select {
	case f := <-done:
		if f.err != nil {
			t.Fatalf("publish %s: %v", e.ID, f.err)
		}
		return f.d
	case <-time.After(30 * time.Second):
		t.Fatal("no ack within 30s")
		return Delivery{}
	}
}

// TestOwnTopicsAreNoDestination: a row whose routing value makes its topic
// walrelay's dead-letter topic, its offsets topic or one of Kafka's
// internal topics, by a template or by a regex route's unmatched value, is
// dead-lettered (forbidden_topic), and nothing reaches those topics but
// the dead letters.
func TestOwnTopicsAreNoDestination(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	col, _ := kafkatest.Collect(kc.Addrs(), `walrelay\.(dlq|offsets)`)
	defer col.Close()
	template := newSink(t, kc, Config{Topic: "{aggregatetype}"})
	regex := newSink(t, kc, Config{Topic: "outbox.$1", TopicRegex: "(order)"})
	n := 0
	for _, s := range []*Sink{template, regex} {
		for _, topic := range []string{"walrelay.dlq", "walrelay.offsets", "__consumer_offsets"} {
			n++
			e := newEvent(fmt.Sprintf("e%d", n))
			e.AggregateType = topic
			if d := publishDelivery(t, s, e); d.DeadLetter != ReasonForbiddenTopic || d.Topic != "walrelay.dlq" {
				t.Fatalf("aggregate type %q: delivered %+v, want dead-lettered (%s)", topic, d, ReasonForbiddenTopic)
			}
		}
	}
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) >= n })
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // anything more would show now
	for _, r := range col.Records() {
		if r.Topic != "walrelay.dlq" || string(kafkatest.Header(r, HeaderReason)) != ReasonForbiddenTopic {
			t.Fatalf("a record on %s, reason %q: want only the dead letters", r.Topic, kafkatest.Header(r, HeaderReason))
		}
	}
	if len(recs) != n {
		t.Fatalf("%d records, want %d dead letters", len(recs), n)
	}
}

// TestAllowedTopics: with AllowedTopics, an event routed to a topic that is
// neither listed nor under a listed prefix is dead-lettered with its reason;
// the others go to their topic; an allowed topic that is walrelay's own,
// or a malformed entry, is refused.
func TestAllowedTopics(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := newSink(t, kc, Config{Topic: "{aggregatetype}", AllowedTopics: []string{"outbox.event.*", "audit"}, ReservedTopics: []string{"my.offsets"}})
	for i, c := range []struct{ topic, deadLetter string }{
		{"outbox.event.order", ""},
		{"audit", ""},
		{"audit.x", ReasonForbiddenTopic},
		{"payments.commands", ReasonForbiddenTopic},
		{"outbox.evenT.x", ReasonForbiddenTopic},
		{"my.offsets", ReasonForbiddenTopic},
		{"has space", "invalid_topic"},
	} {
		e := newEvent(fmt.Sprintf("a%d", i))
		e.AggregateType = c.topic
		if d := publishDelivery(t, s, e); d.DeadLetter != c.deadLetter {
			t.Fatalf("topic %q: delivered %+v, want dead letter %q", c.topic, d, c.deadLetter)
		}
	}
	for _, bad := range [][]string{{"walrelay.dlq"}, {"*"}, {"a b*"}, {"has space"}} {
		if _, err := New(Config{Brokers: kc.Addrs(), AllowedTopics: bad}); err == nil {
			t.Fatalf("allowed topics %q accepted", bad)
		}
	}
}

// TestTopicCacheBounded: 10,000 distinct routing values, invalid topics
// included, do not grow what the sink remembers of topics past its cap
// (nor the regex router's cache past its own: package record,
// TestRegexRouterCacheBounded).
func TestTopicCacheBounded(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := newSink(t, kc, Config{Topic: "{aggregatetype}"})
	for i := range 10000 {
		s.topicInfoFor(t.Context(), fmt.Sprintf("bad type %d", i))
	}
	n := 0
	s.topics.Range(func(_, _ any) bool { n++; return true })
	if n > maxCachedTopics {
		t.Fatalf("%d topics remembered after 10,000 distinct ones, want at most %d", n, maxCachedTopics)
	}
}
