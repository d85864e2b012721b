package sink

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/sink/record"
)

// TestRowMappings: a row's partition column places its record (NULL: the
// key's partition), one beyond the topic's partitions is dead-lettered; the
// timestamp column is the record's timestamp; with TombstoneOnEmpty a NULL
// or blank payload is a tombstone in the JSON format too.
func TestRowMappings(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := newSink(t, kc, Config{PlacedPartitions: true, TombstoneOnEmpty: true, ValueFormat: record.FormatJSON})
	stamp := time.Date(2026, 5, 6, 7, 8, 9, 123e6, time.UTC)
	placed, hashed, beyond, blankOne, null := newEvent("placed"), newEvent("hashed"), newEvent("beyond"), newEvent("blank"), newEvent("null")
	placed.Partition, placed.HasPartition, placed.Time = 2, true, stamp
	byKey := func(key string) int32 {
		return int32(kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: []byte(key)}, kafkatest.Partitions))
	}
	if placed.AggregateID = "o-7"; byKey(placed.AggregateID) == 2 {
		t.Fatal("choose a key whose partition is not 2")
	}
	beyond.Partition, beyond.HasPartition = kafkatest.Partitions, true
	blankOne.Payload, null.Payload = []byte(" \t\n"), nil
	for _, e := range []*event.Event{placed, hashed, beyond, blankOne, null} {
		if err := publish(t, s, e); err != nil {
			t.Fatal(err)
		}
	}
	col, _ := kafkatest.Collect(kc.Addrs(), `outbox\.event\.order|walrelay\.dlq`)
	defer col.Close()
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) == 5 })
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*kgo.Record{}
	for _, r := range recs {
		byID[string(kafkatest.Header(r, "id"))] = r
	}
	if r := byID["placed"]; r.Partition != 2 || !r.Timestamp.Equal(stamp) || string(r.Value) != `"{\"a\":1}"` {
		t.Fatalf("placed: partition %d, timestamp %s, value %s", r.Partition, r.Timestamp, r.Value)
	}
	if r := byID["hashed"]; r.Partition != byKey("o-1") {
		t.Fatalf("hashed: partition %d", r.Partition)
	}
	if r := byID["beyond"]; r.Topic != "walrelay.dlq" || Header(r, HeaderReason) != "invalid_partition" || !strings.Contains(Header(r, HeaderError), "has 4 partitions") {
		t.Fatalf("beyond: %s %s %s", r.Topic, Header(r, HeaderReason), Header(r, HeaderError))
	}
	for _, id := range []string{"blank", "null"} {
		if r := byID[id]; r.Value != nil {
			t.Fatalf("%s: value %q, want a tombstone", id, r.Value)
		}
	}
}

// TestCloudEventsBinary: with CloudEvents "binary" each record carries the
// attributes under the Kafka protocol binding's header names ({table} in
// the source is the event's table), the value stays the payload, and an
// event without a type is dead-lettered.
func TestCloudEventsBinary(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	if _, err := New(Config{Brokers: kc.Addrs(), CloudEvents: "binary"}); err == nil {
		t.Fatal("CloudEvents without a source accepted")
	}
	if _, err := New(Config{Brokers: kc.Addrs(), CloudEvents: "structured", CloudEventsSource: "/x"}); err == nil {
		t.Fatal("structured accepted")
	}
	s := newSink(t, kc, Config{CloudEvents: "binary", CloudEventsSource: "/shop/{table}"})
	stamped, untyped, binary := newEvent("ce-1"), newEvent("ce-2"), newEvent("ce-3")
	stamped.Time = time.Date(2026, 12, 3, 4, 5, 6, 7000, time.UTC)
	untyped.Type = ""
	binary.PayloadBytes = true
	for _, e := range []*event.Event{newEvent("ce-0"), stamped, untyped, binary} {
		if err := publish(t, s, e); err != nil {
			t.Fatal(err)
		}
	}
	col, _ := kafkatest.Collect(kc.Addrs(), `outbox\.event\.order|walrelay\.dlq`)
	defer col.Close()
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) == 4 })
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		id := Header(r, "id")
		if id == "ce-2" {
			if r.Topic != "walrelay.dlq" || Header(r, HeaderReason) != "invalid_event" || !strings.Contains(Header(r, HeaderError), "ce_type") {
				t.Fatalf("untyped: %s %s %s", r.Topic, Header(r, HeaderReason), Header(r, HeaderError))
			}
			continue
		}
		want := map[string]string{"ce_specversion": "1.0", "ce_id": id, "ce_source": "/shop/public.outbox", "ce_type": "Created",
			"ce_subject": "o-1", "content-type": "application/json", "ce_time": "2026-01-02T03:04:05.000006Z"}
		switch id {
		case "ce-1":
			want["ce_time"] = "2026-12-03T04:05:06.000007Z"
		case "ce-3":
			want["content-type"] = "application/octet-stream"
		}
		for k, v := range want {
			if got := Header(r, k); got != v {
				t.Fatalf("%s: header %s %q, want %q", id, k, got, v)
			}
		}
		if _, err := time.Parse(time.RFC3339, Header(r, "ce_time")); err != nil {
			t.Fatalf("%s: ce_time: %v", id, err)
		}
		if string(r.Value) != `{"a":1}` || Header(r, "type") != "Created" {
			t.Fatalf("%s: value %s, type header %q", id, r.Value, Header(r, "type"))
		}
	}
}

// TestJSONFormatsOfPayloadTypes: with json_schema, a text payload column's
// value schema is a plain optional string (Debezium's for text), a json
// one's is named io.debezium.data.Json, and a bytea payload is base64 of
// schema type bytes, as the JsonConverter writes Connect's bytes; a NOT
// NULL payload column's schema is required (optional false).
func TestJSONFormatsOfPayloadTypes(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := newSink(t, kc, Config{ValueFormat: record.FormatJSONSchema})
	text, raw := newEvent("text"), newEvent("bytea")
	text.PayloadText = true
	raw.PayloadBytes, raw.Payload = true, []byte{0xff, 0x00, 'a'}
	// The same of a NOT NULL payload column.
	reqJSON, reqText, reqRaw := newEvent("json NOT NULL"), newEvent("text NOT NULL"), newEvent("bytea NOT NULL")
	reqText.PayloadText = true
	reqRaw.PayloadBytes, reqRaw.Payload = true, []byte{0xff, 0x00, 'a'}
	for _, e := range []*event.Event{reqJSON, reqText, reqRaw} {
		e.PayloadRequired = true
	}
	for _, e := range []*event.Event{newEvent("json"), text, raw, reqJSON, reqText, reqRaw} {
		if err := publish(t, s, e); err != nil {
			t.Fatal(err)
		}
	}
	col, _ := kafkatest.Collect(kc.Addrs(), `outbox\.event\.order`)
	defer col.Close()
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) == 6 })
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"bytea":          `{"schema":{"type":"bytes","optional":true},"payload":"/wBh"}`,
		"json":           `{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"{\"a\":1}"}`,
		"text":           `{"schema":{"type":"string","optional":true},"payload":"{\"a\":1}"}`,
		"bytea NOT NULL": `{"schema":{"type":"bytes","optional":false},"payload":"/wBh"}`,
		"json NOT NULL":  `{"schema":{"type":"string","optional":false,"name":"io.debezium.data.Json","version":1},"payload":"{\"a\":1}"}`,
		"text NOT NULL":  `{"schema":{"type":"string","optional":false},"payload":"{\"a\":1}"}`,
	}
	for _, r := range recs {
		if id := Header(r, "id"); string(r.Value) != want[id] {
			t.Fatalf("%s: %s, want %s", id, r.Value, want[id])
		}
	}
}

// TestRoutesByTable: the events of a table with a route of its own go by
// it, a template or a regex; the others by Topic; a bad route is refused
// with its table named.
func TestRoutesByTable(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	if _, err := New(Config{Brokers: kc.Addrs(), Routes: map[string]record.Route{"billing.events": {Topic: "a{b}"}}}); err == nil || !strings.Contains(err.Error(), "table billing.events") {
		t.Fatalf("a bad route: %v", err)
	}
	s := newSink(t, kc, Config{Routes: map[string]record.Route{"billing.events": {Topic: "billing.{type}"}, "audit.log": {Topic: "audit.$1", TopicRegex: "(or)der"}}})
	billing, audit := newEvent("b"), newEvent("a")
	billing.Source, audit.Source = "billing.events", "audit.log"
	for e, want := range map[*event.Event]string{newEvent("o"): "outbox.event.order", billing: "billing.Created", audit: "audit.or"} {
		if got := s.Topic(e); got != want {
			t.Fatalf("%s: topic %s, want %s", e.Source, got, want)
		}
		if err := publish(t, s, e); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTooLargeEventDeadLettered: an event the source could not hold (its
// Invalid wraps event.ErrTooLarge) goes to the dead-letter topic as
// too_large, without a value, with the payload's size in
// walrelay.payload_omitted_bytes; an invalid event of another kind stays
// invalid_event.
func TestTooLargeEventDeadLettered(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	s := newSink(t, kc, Config{})
	big, bad, cut := newEvent("big"), newEvent("bad"), newEvent("cut")
	big.Payload, big.OmittedBytes = nil, 150_000_000
	big.Invalid = fmt.Errorf("%w: over postgres.max_message_bytes", event.ErrTooLarge)
	bad.Invalid = errors.New("column id is NULL")
	// Its aggregate type was past the head that was read: its topic is not
	// known, and walrelay.topic says nothing rather than a wrong one.
	cut.Payload, cut.OmittedBytes, cut.AggregateType, cut.Invalid = nil, 150_000_000, "", big.Invalid
	for _, e := range []*event.Event{big, bad, cut} {
		if err := publish(t, s, e); err != nil {
			t.Fatal(err)
		}
	}
	col, _ := kafkatest.Collect(kc.Addrs(), `walrelay\.dlq`)
	defer col.Close()
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) == 3 })
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		reason, omitted := Header(r, HeaderReason), Header(r, HeaderOmitted)
		switch Header(r, "id") {
		case "cut":
			if reason != "too_large" || Header(r, HeaderTopic) != "" {
				t.Fatalf("too large, its aggregate type not kept: reason %s, walrelay.topic %q, want empty", reason, Header(r, HeaderTopic))
			}
		case "big":
			if reason != "too_large" || omitted != "150000000" || r.Value != nil || !strings.Contains(Header(r, HeaderError), "postgres.max_message_bytes") {
				t.Fatalf("too large: reason %s, omitted %q, value %q", reason, omitted, r.Value)
			}
			// The topic it was routed to, as docs/outbox.md says (issue 48
			// item 2: it was empty).
			if got, want := Header(r, HeaderTopic), s.Topic(big); got != want || want == "" {
				t.Fatalf("too large: walrelay.topic %q, want %q", got, want)
			}
		case "bad":
			if reason != "invalid_event" || omitted != "" {
				t.Fatalf("invalid: reason %s, omitted %q", reason, omitted)
			}
		}
	}
}
