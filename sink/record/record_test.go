package record

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
)

func testEvent(id string) *event.Event {
	return &event.Event{ID: id, AggregateType: "order", AggregateID: "o-1", Type: "Created", Payload: []byte(`{"a":1}`),
		Headers: []event.Header{{Key: "tenant", Value: []byte("7")}}, Source: "public.outbox", Xid: 12, CommitLSN: 0x1234,
		CommitTime: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)}
}

func newBuilder(t *testing.T, cfg Config) *Builder {
	t.Helper()
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// build is what the sink does with a Builder for an event of no registry
// format: Route, Record, Encode.
func build(t *testing.T, b *Builder, e *event.Event) *kgo.Record {
	t.Helper()
	topic, _ := b.Route(e)
	r, err := b.Record(e, topic)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Encode(e, r, 0); err != nil {
		t.Fatal(err)
	}
	return r
}

func headers(r *kgo.Record) map[string]string {
	m := map[string]string{}
	for _, h := range r.Headers {
		m[h.Key] = string(h.Value)
	}
	return m
}

// TestRecordOfAnEvent: an event's record without a client: the topic of its
// template, the raw key and value, the headers in their order, no
// partition and no timestamp of its own (the sink stamps it); the same
// event gives the same record again.
func TestRecordOfAnEvent(t *testing.T) {
	t.Parallel()
	b := newBuilder(t, Config{Topic: "events.{aggregatetype}.{type}"})
	r := build(t, b, testEvent("e1"))
	if r.Topic != "events.order.Created" || string(r.Key) != "o-1" || string(r.Value) != `{"a":1}` || r.Partition != -1 || !r.Timestamp.IsZero() {
		t.Fatalf("record %s key %q value %q partition %d timestamp %s", r.Topic, r.Key, r.Value, r.Partition, r.Timestamp)
	}
	var keys []string
	for _, h := range r.Headers {
		keys = append(keys, h.Key)
	}
	if want := []string{"id", "type", "walrelay.lsn", "walrelay.xid", "walrelay.commit_time", "tenant"}; !reflect.DeepEqual(keys, want) {
		t.Fatalf("headers %v, want %v", keys, want)
	}
	if got, want := headers(r), map[string]string{"id": "e1", "type": "Created", "walrelay.lsn": "0/1234", "walrelay.xid": "12",
		"walrelay.commit_time": "2026-01-02T03:04:05.000006Z", "tenant": "7"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("headers %v, want %v", got, want)
	}
	if again := build(t, b, testEvent("e1")); !reflect.DeepEqual(again, r) {
		t.Fatalf("the same event again: %+v, want %+v", again, r)
	}
	timed := testEvent("e2")
	timed.Time = time.Date(2026, 12, 3, 4, 5, 6, 0, time.UTC)
	if r := build(t, b, timed); !r.Timestamp.Equal(timed.Time) {
		t.Fatalf("timestamp %s, want the event's time %s", r.Timestamp, timed.Time)
	}
}

// TestRecordHeadersOmittedAndCloudEvents: OmitHeaders leaves the optional
// headers out (never id); CloudEvents adds the binding's headers, ce_time
// the commit time without walrelay.commit_time, and refuses an event
// without a type; an event of no known time has no commit time header.
func TestRecordHeadersOmittedAndCloudEvents(t *testing.T) {
	t.Parallel()
	b := newBuilder(t, Config{OmitHeaders: OptionalHeaders[:], CloudEvents: "binary", CloudEventsSource: "/shop/{table}"})
	r := build(t, b, testEvent("e1"))
	want := map[string]string{"id": "e1", "tenant": "7", "ce_specversion": "1.0", "ce_id": "e1", "ce_source": "/shop/public.outbox",
		"ce_type": "Created", "ce_subject": "o-1", "content-type": "application/json", "ce_time": "2026-01-02T03:04:05.000006Z"}
	if got := headers(r); !reflect.DeepEqual(got, want) {
		t.Fatalf("headers %v, want %v", got, want)
	}
	untyped := testEvent("e2")
	untyped.Type = ""
	if _, err := b.Record(untyped, "t"); err == nil || !strings.Contains(err.Error(), "ce_type") {
		t.Fatalf("an untyped CloudEvent: %v, want refused", err)
	}
	timeless := testEvent("e3")
	timeless.CommitTime = time.Time{}
	if r := build(t, newBuilder(t, Config{}), timeless); headers(r)[HeaderCommitTime] != "" || len(r.Headers) != 5 {
		t.Fatalf("an event of no known time: headers %v", headers(r))
	}
	for _, c := range []Config{
		{OmitHeaders: []string{"id"}},
		{OmitHeaders: []string{"walrelay.nothing"}},
		{CloudEvents: "structured", CloudEventsSource: "/x"},
		{CloudEvents: "binary"},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// TestRecordEncoded: Encode writes the JSON formats (a tombstone of a
// blank payload with TombstoneOnEmpty), leaves the registry formats to the
// sink, and stops an expansion past maxBytes (ErrExpandedTooLarge).
func TestRecordEncoded(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg        Config
		payload    string
		key, value string
	}{
		{Config{}, `{"a":1}`, `o-1`, `{"a":1}`},
		{Config{KeyFormat: FormatJSON, ValueFormat: FormatJSON}, `{"a":1}`, `"o-1"`, `"{\"a\":1}"`},
		{Config{ValueFormat: FormatJSON, ExpandJSONPayload: true}, `{"a":1}`, `o-1`, `{"a":1}`},
		{Config{ValueFormat: FormatJSON, TombstoneOnEmpty: true}, "  ", `o-1`, ""},
		{Config{ValueFormat: FormatRegisteredAvro}, `{"a":1}`, `o-1`, `{"a":1}`},
		{Config{KeyFormat: FormatAvro, ValueFormat: FormatRegistryPassthrough}, `{"a":1}`, `o-1`, `{"a":1}`},
	} {
		e := testEvent("e1")
		e.Payload = []byte(c.payload)
		r := build(t, newBuilder(t, c.cfg), e)
		if string(r.Key) != c.key || string(r.Value) != c.value {
			t.Errorf("%+v: key %s value %q, want %s %q", c.cfg, r.Key, r.Value, c.key, c.value)
		}
	}
	b := newBuilder(t, Config{ValueFormat: FormatJSON, ExpandJSONPayload: true})
	e := testEvent("wide")
	e.Payload = []byte(`{"a":"` + strings.Repeat("x", 200) + `"}`)
	r, err := b.Record(e, "t")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Encode(e, r, 100); !errors.Is(err, ErrExpandedTooLarge) {
		t.Fatalf("expanded past maxBytes: %v, want ErrExpandedTooLarge", err)
	}
}

// TestRouteOfATable: a table with a route of its own goes by it, the
// others by Topic; Route names the template for an error; CheckTopic
// refuses walrelay's own topics and those outside AllowedTopics.
func TestRouteOfATable(t *testing.T) {
	t.Parallel()
	b := newBuilder(t, Config{Topic: "app.{aggregatetype}", AllowedTopics: []string{"app.*"}, DLQTopic: "app.dlq",
		Routes: map[string]Route{"billing.events": {Topic: "app.billing.{type}"}}})
	e := testEvent("e1")
	if topic, template := b.Route(e); topic != "app.order" || template != "app.{aggregatetype}" {
		t.Fatalf("route %s by %s", topic, template)
	}
	e.Source = "billing.events"
	if topic, template := b.Route(e); topic != "app.billing.Created" || template != "app.billing.{type}" {
		t.Fatalf("route of billing.events %s by %s", topic, template)
	}
	for topic, ok := range map[string]bool{"app.order": true, "app.dlq": false, "other": false, "bad topic": false} {
		if err := b.CheckTopic(topic); (err == nil) != ok {
			t.Errorf("%s: %v, want allowed %v", topic, err, ok)
		}
	}
	if err := b.CheckTopic("app.dlq"); !errors.Is(err, errForbidden) {
		t.Errorf("the dead-letter topic: %v, want errForbidden", err)
	}
	if _, err := New(Config{Routes: map[string]Route{"billing.events": {Topic: "a{b}"}}}); err == nil || !strings.Contains(err.Error(), "table billing.events") {
		t.Errorf("a bad route: %v", err)
	}
}
