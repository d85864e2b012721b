package decoder

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/apd/v3"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/testkit/pgoutputtest"
)

// The pgoutput encoders, under the names these tests use.
var (
	beginMsg    = pgoutputtest.Begin
	commitMsg   = pgoutputtest.Commit
	relationMsg = pgoutputtest.Relation
	insertMsg   = pgoutputtest.Insert
	logicalMsg  = pgoutputtest.Logical
)

type col = pgoutputtest.Col

func s(v string) *string { return &v }

var outboxCols = []col{
	{Name: "id", OID: oidUUID}, {Name: "aggregatetype", OID: oidVarchar}, {Name: "aggregateid", OID: oidVarchar},
	{Name: "type", OID: oidVarchar}, {Name: "payload", OID: oidJSONB}, {Name: "tenant", OID: oidInt8}, {Name: "amount", OID: oidNumeric},
	{Name: "created_at", OID: oidTimestamptz}, {Name: "urgent", OID: oidBool},
}

const testID = "0b8c2a6e-5d36-4d43-9f53-6c0f3c7f1a11"

func newDecoder(t *testing.T) *Decoder {
	t.Helper()
	d, err := New(Config{Layout: Layout{HeaderColumns: []string{"tenant", "amount", "created_at", "urgent"}}, Messages: true})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mustDecode(t *testing.T, d *Decoder, data []byte) Message {
	t.Helper()
	m, err := d.Decode(0x100, data)
	if err != nil {
		t.Fatalf("decode %q: %v", data[0], err)
	}
	return m
}

func TestInsertBecomesEvent(t *testing.T) {
	t.Parallel()
	d := newDecoder(t)
	at := time.Date(2026, 12, 2, 10, 0, 0, 123456000, time.UTC)
	mustDecode(t, d, relationMsg(16384, "public", "outbox", outboxCols))
	if b, ok := mustDecode(t, d, beginMsg(0x5000, at, 731)).(Begin); !ok || b.FinalLSN != 0x5000 || b.Xid != 731 || !b.CommitTime.Equal(at) {
		t.Fatalf("begin decoded to %#v", b)
	}
	m := mustDecode(t, d, insertMsg(16384, s(testID), s("order"), s("o-17"), s("OrderCreated"), s(`{"total": 12.50}`),
		s("42"), s("12345678901234567890.000000000000000001"), s("2026-12-02 10:00:00.5+00"), s("t")))
	e, ok := m.(EventMessage)
	if !ok {
		t.Fatalf("insert decoded to %#v", m)
	}
	if e.Invalid != nil {
		t.Fatalf("valid row marked invalid: %v", e.Invalid)
	}
	if e.ID != testID || e.AggregateType != "order" || e.AggregateID != "o-17" || e.Type != "OrderCreated" ||
		string(e.Payload) != `{"total": 12.50}` || e.Xid != 731 || e.CommitLSN != 0x5000 || e.Source != "public.outbox" || !e.Transactional {
		t.Fatalf("event %+v", e)
	}
	want := []event.Header{
		{Key: "tenant", Value: []byte("42")},
		{Key: "amount", Value: []byte("12345678901234567890.000000000000000001")},
		{Key: "created_at", Value: []byte("2026-12-02T10:00:00.5Z")},
		{Key: "urgent", Value: []byte("true")},
	}
	if len(e.Headers) != len(want) {
		t.Fatalf("headers %q, want %q", e.Headers, want)
	}
	for i := range want {
		if e.Headers[i].Key != want[i].Key || string(e.Headers[i].Value) != string(want[i].Value) {
			t.Fatalf("header %d: %s=%q, want %s=%q", i, e.Headers[i].Key, e.Headers[i].Value, want[i].Key, want[i].Value)
		}
	}
	c, ok := mustDecode(t, d, commitMsg(0x5000, 0x5030, at)).(Commit)
	if !ok || c.EndLSN != 0x5030 || c.CommitLSN != 0x5000 {
		t.Fatalf("commit decoded to %#v", c)
	}
}

// TestHeaderNames: a header column of another header name (Debezium's
// placement type:header:eventType) is written under that name, the
// event's type column included; names that clash, are empty, or name no
// header column are refused.
func TestHeaderNames(t *testing.T) {
	t.Parallel()
	d, err := New(Config{Layout: Layout{HeaderColumns: []string{"type", "tenant"}, HeaderNames: map[string]string{"type": "eventType"}}})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	mustDecode(t, d, relationMsg(16384, "public", "outbox", outboxCols))
	mustDecode(t, d, beginMsg(0x5000, at, 731))
	e := mustDecode(t, d, insertMsg(16384, s(testID), s("order"), s("o-17"), s("OrderCreated"), s(`{}`), s("42"), nil, nil, nil)).(EventMessage)
	if len(e.Headers) != 2 || e.Headers[0].Key != "eventType" || string(e.Headers[0].Value) != "OrderCreated" || e.Headers[1].Key != "tenant" || string(e.Headers[1].Value) != "42" {
		t.Fatalf("headers %q, want eventType=OrderCreated and tenant=42", e.Headers)
	}
	for _, l := range []Layout{
		{HeaderColumns: []string{"type", "tenant"}, HeaderNames: map[string]string{"type": "tenant"}},
		{HeaderColumns: []string{"type"}, HeaderNames: map[string]string{"type": ""}},
		{HeaderColumns: []string{"tenant"}, HeaderNames: map[string]string{"type": "eventType"}},
	} {
		if _, err := New(Config{Layout: l}); err == nil {
			t.Errorf("%+v accepted", l)
		}
	}
}

func TestRowErrorsMarkTheEventInvalid(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		vals []*string
		want string
	}{
		{"null aggregateid", []*string{s(testID), s("order"), nil, s("T"), s("{}"), nil, nil, nil, nil}, "column aggregateid is NULL"},
		{"null id", []*string{nil, s("order"), s("a"), s("T"), s("{}"), nil, nil, nil, nil}, "column id is NULL"},
		{"bad header value", []*string{s(testID), s("order"), s("a"), s("T"), s("{}"), s("x"), nil, nil, nil}, "column tenant"},
		{"bad uuid", []*string{s("nope"), s("order"), s("a"), s("T"), s("{}"), nil, nil, nil, nil}, "uuid"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newDecoder(t)
			mustDecode(t, d, relationMsg(1, "public", "outbox", outboxCols))
			mustDecode(t, d, beginMsg(0x10, time.Now(), 1))
			e := mustDecode(t, d, insertMsg(1, tc.vals...)).(EventMessage)
			if e.Invalid == nil || !strings.Contains(e.Invalid.Error(), tc.want) {
				t.Fatalf("Invalid = %v, want it to mention %q", e.Invalid, tc.want)
			}
		})
	}
}

// TestNullPayloadIsATombstone: a NULL payload is a nil payload (a
// tombstone), and a NULL header column a header with a nil value (a null
// Kafka header, as Debezium's header placement writes).
func TestNullPayloadIsATombstone(t *testing.T) {
	t.Parallel()
	d := newDecoder(t)
	mustDecode(t, d, relationMsg(1, "public", "outbox", outboxCols))
	mustDecode(t, d, beginMsg(0x10, time.Now(), 1))
	e := mustDecode(t, d, insertMsg(1, s(testID), s("order"), s("a"), nil, nil, nil, nil, nil, nil)).(EventMessage)
	if e.Invalid != nil || e.Payload != nil || len(e.Headers) != 4 {
		t.Fatalf("event %+v", e.Event)
	}
	for _, h := range e.Headers {
		if h.Value != nil {
			t.Fatalf("header %s of a NULL column: %q", h.Key, h.Value)
		}
	}
}

func TestByteaPayloadIsDecoded(t *testing.T) {
	t.Parallel()
	d := newDecoder(t)
	cols := append([]col(nil), outboxCols[:5]...)
	cols[4].OID = oidBytea
	d2, _ := New(Config{})
	for _, dd := range []*Decoder{d2} {
		mustDecode(t, dd, relationMsg(1, "public", "outbox", cols))
		mustDecode(t, dd, beginMsg(0x10, time.Now(), 1))
		e := mustDecode(t, dd, insertMsg(1, s(testID), s("order"), s("a"), s("T"), s(`\x00ff41`))).(EventMessage)
		if e.Invalid != nil || string(e.Payload) != "\x00\xffA" {
			t.Fatalf("event %+v", e)
		}
	}
	_ = d
}

func TestMissingColumnStopsTheStream(t *testing.T) {
	t.Parallel()
	d := newDecoder(t)
	_, err := d.Decode(0x42, relationMsg(1, "public", "outbox", outboxCols[:3]))
	var de *Error
	if !errors.As(err, &de) || !errors.Is(err, ErrMissingColumn) || de.WALStart != 0x42 {
		t.Fatalf("err = %v, want *Error wrapping ErrMissingColumn", err)
	}
	if !strings.Contains(err.Error(), `no column "type"`) {
		t.Fatalf("error does not name the column: %v", err)
	}
}

func TestOtherChangesAreIgnored(t *testing.T) {
	t.Parallel()
	d, err := New(Config{Messages: true, IgnoredPrefixes: []string{"debezium"}})
	if err != nil {
		t.Fatal(err)
	}
	mustDecode(t, d, relationMsg(1, "public", "outbox", outboxCols))
	mustDecode(t, d, beginMsg(0x10, time.Now(), 1))
	upd := []byte{'U', 0, 0, 0, 1, 'N', 0, 1, 'n'}
	del := []byte{'D', 0, 0, 0, 1, 'K', 0, 1, 'n'}
	trunc := []byte{'T', 0, 0, 0, 1, 0, 0, 0, 0, 1}
	for data, kind := range map[string]string{
		string(upd): "update", string(del): "delete", string(trunc): "truncate",
		string(logicalMsg(false, 0x11, "walrelay.heartbeat", "{}")): "heartbeat",
	} {
		if got := mustDecode(t, d, []byte(data)); got != (Ignored{Kind: kind}) {
			t.Errorf("%q decoded to %#v, want Ignored %s", data[0], got, kind)
		}
	}
}

// TestWhatCouldHideAnEventStops: a table in the publication that is not the
// outbox (a partition published under its own name, a table added by hand)
// stops the stream, rather than letting its transactions be confirmed
// unpublished.
func TestWhatCouldHideAnEventStops(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		data []byte
		want error
	}{
		"partition under its own name": {insertMsg(7, s(testID), s("order"), s("a"), s("T"), s("{}"), nil, nil, nil, nil), ErrUnexpectedRelation},
		"another table":                {insertMsg(8, s("1")), ErrUnexpectedRelation},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d, err := New(Config{Layout: Layout{RelationID: 1}, MessagePrefix: "orders"})
			if err != nil {
				t.Fatal(err)
			}
			// Described, they are no error: pgoutput describes a partition
			// too when it sends its rows as the root's.
			mustDecode(t, d, relationMsg(7, "public", "outbox_2026_12", outboxCols))
			mustDecode(t, d, relationMsg(8, "public", "orders", []col{{Name: "id", OID: oidInt8}}))
			mustDecode(t, d, beginMsg(0x10, time.Now(), 1))
			_, err = d.Decode(0x42, c.data)
			var de *Error
			if !errors.As(err, &de) || !errors.Is(err, c.want) || de.WALStart != 0x42 {
				t.Fatalf("err = %v, want *Error wrapping %v", err, c.want)
			}
		})
	}
}

// TestForeignPrefixesAreIgnored: a message under a prefix walrelay does not
// read, which any role can emit, is ignored and named (for the log and the
// count), inside a transaction or not; it never stops the stream. (Before,
// it was an error that stopped walrelay, at every restart again.)
func TestForeignPrefixesAreIgnored(t *testing.T) {
	t.Parallel()
	d, err := New(Config{Layout: Layout{RelationID: 1}, MessagePrefix: "orders", Messages: true, IgnoredPrefixes: []string{"debezium"}})
	if err != nil {
		t.Fatal(err)
	}
	mustDecode(t, d, beginMsg(0x10, time.Now(), 1))
	for _, c := range []struct {
		data []byte
		want Ignored
	}{
		{logicalMsg(true, 0x11, "walrelay", "{}"), Ignored{Kind: "message_foreign_prefix", Prefix: "walrelay"}},
		{logicalMsg(true, 0x12, "not-walrelay", "y"), Ignored{Kind: "message_foreign_prefix", Prefix: "not-walrelay"}},
		{logicalMsg(false, 0x13, "other", "{}"), Ignored{Kind: "message_foreign_prefix", Prefix: "other"}},
		{logicalMsg(true, 0x14, "debezium", "{}"), Ignored{Kind: "message_ignored_prefix", Prefix: "debezium"}},
		{logicalMsg(false, 0x15, "orders.heartbeat", "beat"), Ignored{Kind: "heartbeat"}},
	} {
		m, err := d.Decode(0x42, c.data)
		if err != nil || m != c.want {
			t.Errorf("message %q: %#v, %v; want %#v", c.data, m, err, c.want)
		}
	}
	if _, ok := mustDecode(t, d, logicalMsg(true, 0x16, "orders", `{"id":"x","aggregatetype":"a","aggregateid":"b"}`)).(EventMessage); !ok {
		t.Fatal("a message under the read prefix is no event")
	}
}

// TestMessagesAreOffUnlessConfigured: without Messages, a message under the
// read prefix is no event, whoever emitted it: pg_logical_emit_message is
// granted to every role, so only a configuration that says the writers
// alone may call it (Messages) turns messages into events. (Before, every
// message under the prefix was an event.)
func TestMessagesAreOffUnlessConfigured(t *testing.T) {
	t.Parallel()
	d, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	mustDecode(t, d, beginMsg(0x10, time.Now(), 1))
	forged := `{"id":"` + testID + `","aggregatetype":"payments","aggregateid":"acct-1","type":"RefundApproved","payload":{"amount":1000000}}`
	for _, data := range [][]byte{logicalMsg(true, 0x11, "walrelay", forged), logicalMsg(false, 0x12, "walrelay", forged)} {
		m, err := d.Decode(0x42, data)
		if want := (Ignored{Kind: "message_source_off", Prefix: "walrelay"}); err != nil || m != want {
			t.Errorf("message %q: %#v, %v; want %#v", data, m, err, want)
		}
	}
}

// TestOutboxKnownByItsID: with the table's OID configured, a Relation
// message under another name (the table renamed, or the root of a
// partitioned outbox seen through a view of another name) is the outbox.
func TestOutboxKnownByItsID(t *testing.T) {
	t.Parallel()
	d, err := New(Config{Layout: Layout{RelationID: 4242}})
	if err != nil {
		t.Fatal(err)
	}
	mustDecode(t, d, relationMsg(4242, "app", "outbox_renamed", outboxCols))
	mustDecode(t, d, beginMsg(0x10, time.Now(), 1))
	e, ok := mustDecode(t, d, insertMsg(4242, s(testID), s("order"), s("a"), s("T"), s("{}"), nil, nil, nil, nil)).(EventMessage)
	if !ok || e.ID != testID {
		t.Fatalf("insert decoded to %#v", e)
	}
}

func TestLogicalMessageBecomesEvent(t *testing.T) {
	t.Parallel()
	d := newDecoder(t)
	mustDecode(t, d, beginMsg(0x10, time.Now(), 9))
	e := mustDecode(t, d, logicalMsg(true, 0x11, "walrelay",
		`{"id":"`+testID+`","aggregatetype":"order","aggregateid":"a1","type":"Paid","payload":{"x":[1,2]}}`)).(EventMessage)
	if e.Invalid != nil || e.ID != testID || e.AggregateID != "a1" || e.Type != "Paid" || string(e.Payload) != `{"x":[1,2]}` || e.Source != "message" || e.Xid != 9 {
		t.Fatalf("event %+v", e)
	}
	e = mustDecode(t, d, logicalMsg(true, 0x12, "walrelay", `{"id":"x","aggregatetype":"order"}`)).(EventMessage)
	if e.Invalid == nil || !strings.Contains(e.Invalid.Error(), `"aggregateid"`) || e.Payload != nil {
		t.Fatalf("message without aggregateid: %+v", e)
	}
	e = mustDecode(t, d, logicalMsg(true, 0x13, "walrelay", `not json`)).(EventMessage)
	if e.Invalid == nil || string(e.Payload) != "not json" {
		t.Fatalf("non-JSON message: %+v", e)
	}
	mustDecode(t, d, commitMsg(0x10, 0x20, time.Now()))
	e = mustDecode(t, d, logicalMsg(false, 0x30, "walrelay", `{}`)).(EventMessage)
	if e.Invalid == nil || e.Transactional {
		t.Fatalf("non-transactional message: %+v", e)
	}
}

func TestMalformedMessagesAreErrors(t *testing.T) {
	t.Parallel()
	full := insertMsg(1, s(testID), s("order"), s("a"), s("T"), s("{}"), nil, nil, nil, nil)
	cases := map[string][]byte{
		"empty":            {},
		"unknown type":     {'?', 1, 2},
		"truncated insert": full[:len(full)-3],
		"truncated begin":  beginMsg(1, time.Now(), 1)[:10],
		"unknown relation": insertMsg(99, s("x")),
		"commit outside":   commitMsg(1, 2, time.Now()),
		"column count":     insertMsg(1, s(testID)),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d := newDecoder(t)
			mustDecode(t, d, relationMsg(1, "public", "outbox", outboxCols))
			if name != "commit outside" {
				mustDecode(t, d, beginMsg(0x10, time.Now(), 1))
			}
			_, err := d.Decode(0x77, data)
			var de *Error
			if !errors.As(err, &de) {
				t.Fatalf("err = %v, want *Error", err)
			}
		})
	}
}

func TestParseText(t *testing.T) {
	t.Parallel()
	cases := []struct {
		oid  uint32
		in   string
		want string
	}{
		{oidNumeric, "NaN", "NaN"},
		{oidNumeric, "Infinity", "Infinity"},
		{oidNumeric, "-Infinity", "-Infinity"},
		{oidNumeric, "0.1000000000000000000000000000001", "0.1000000000000000000000000000001"},
		{oidNumeric, "-12.50", "-12.50"},
		{oidInt2, "-32768", "-32768"},
		{oidInt8, "9223372036854775807", "9223372036854775807"},
		{oidBool, "f", "false"},
		{oidTimestamptz, "2026-01-02 03:04:05+00", "2026-01-02T03:04:05Z"},
		{oidTimestamptz, "2026-01-02 03:04:05.000001+05:30", "2026-01-01T21:34:05.000001Z"},
		{oidTimestamptz, "infinity", "infinity"},
		{oidTimestamptz, "-infinity", "-infinity"},
		{oidBytea, `\x6869`, "hi"},
		{oidJSONB, `{"a": 1}`, `{"a": 1}`},
		{oidText, "plain", "plain"},
	}
	for _, tc := range cases {
		v, err := ParseText(tc.oid, []byte(tc.in))
		if err != nil {
			t.Errorf("ParseText(%d, %q): %v", tc.oid, tc.in, err)
			continue
		}
		if got := string(Format(v)); got != tc.want {
			t.Errorf("ParseText(%d, %q) formats as %q, want %q", tc.oid, tc.in, got, tc.want)
		}
	}
	if v, _ := ParseText(oidNumeric, []byte("0.1000000000000000000000000000001")); v.(*apd.Decimal).Exponent != -31 {
		t.Errorf("numeric lost its exact scale: %v", v)
	}
	for _, bad := range []struct {
		oid uint32
		in  string
	}{{oidInt2, "40000"}, {oidBool, "yes"}, {oidNumeric, "1.2.3"}, {oidTimestamptz, "yesterday"}, {oidBytea, "plain"}, {oidBytea, `\xzz`}, {oidUUID, "123"}} {
		if _, err := ParseText(bad.oid, []byte(bad.in)); err == nil {
			t.Errorf("ParseText(%d, %q): no error", bad.oid, bad.in)
		}
	}
}

// BenchmarkDecodeInsert decodes the hot path: one outbox insert of a
// ~300-byte payload, with allocations reported.
func BenchmarkDecodeInsert(b *testing.B) {
	d, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := d.Decode(1, relationMsg(1, "public", "outbox", outboxCols[:5])); err != nil {
		b.Fatal(err)
	}
	if _, err := d.Decode(2, beginMsg(0x10, time.Now(), 1)); err != nil {
		b.Fatal(err)
	}
	payload := `{"seq": 12345, "pad": "` + strings.Repeat("x", 270) + `"}`
	msg := insertMsg(1, s(testID), s("order"), s("agg-17"), s("OrderCreated"), s(payload))
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Decode(3, msg); err != nil {
			b.Fatal(err)
		}
	}
}

func TestIsUUID(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{
		"bcb8f1cc-6285-4220-b19b-b0cf11830ae7":  true,
		"BCB8F1CC-6285-4220-B19B-B0CF11830AE7":  true,
		"bcb8f1cc-6285-4220-b19b-b0cf11830ae":   false, // short
		"bcb8f1cc-6285-4220-b19b-b0cf11830ae77": false,
		"bcb8f1cc06285-4220-b19b-b0cf11830ae7":  false, // a dash missing
		"bcb8f1cc-6285-4220-b19b-b0cf11830aeg":  false, // not hex
		"gcb8f1cc-6285-4220-b19b-b0cf11830ae7":  false,
		"bcb8f1cc-6285-4220-b19b-b0cf1183-ae7":  false, // a dash too many
		"":                                      false,
	} {
		if got := isUUID([]byte(in)); got != want {
			t.Errorf("isUUID(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestPartitionAndTimestampColumns: the partition column places the event
// (NULL: not placed; negative: invalid), the timestamp column gives its
// time (a timestamp without zone and a date as UTC; NULL and infinity:
// none); a column of another type stops the stream at its Relation.
func TestPartitionAndTimestampColumns(t *testing.T) {
	t.Parallel()
	cols := []col{{Name: "id", OID: oidUUID}, {Name: "aggregatetype", OID: oidVarchar}, {Name: "aggregateid", OID: oidVarchar},
		{Name: "type", OID: oidVarchar}, {Name: "payload", OID: oidJSONB}, {Name: "shard", OID: oidInt4}, {Name: "at", OID: oidTimestamp}, {Name: "day", OID: oidDate}}
	for _, c := range []struct {
		stampCol, shard, at, day *string
		partition                int32
		placed                   bool
		time                     time.Time
		invalid                  string
	}{
		{s("at"), s("3"), s("2026-12-03 04:05:06.789"), nil, 3, true, time.Date(2026, 12, 3, 4, 5, 6, 789e6, time.UTC), ""},
		{s("at"), nil, nil, nil, 0, false, time.Time{}, ""},
		{s("at"), s("-1"), s("infinity"), nil, 0, false, time.Time{}, "-1 is not a Kafka partition"},
		{s("day"), s("0"), nil, s("2026-12-03"), 0, true, time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC), ""},
		{s("at"), s("1"), s("03.12.2026"), nil, 1, true, time.Time{}, "not in ISO form"},
	} {
		d, err := New(Config{Layout: Layout{PartitionColumn: "shard", TimestampColumn: *c.stampCol}})
		if err != nil {
			t.Fatal(err)
		}
		mustDecode(t, d, relationMsg(16384, "public", "outbox", cols))
		mustDecode(t, d, beginMsg(0x5000, time.Now(), 1))
		e := mustDecode(t, d, insertMsg(16384, s(testID), s("order"), s("o-1"), s("T"), s("{}"), c.shard, c.at, c.day)).(EventMessage)
		if e.Partition != c.partition || e.HasPartition != c.placed || !e.Time.Equal(c.time) {
			t.Fatalf("%+v: partition %d %v, time %s", c, e.Partition, e.HasPartition, e.Time)
		}
		if (e.Invalid == nil) != (c.invalid == "") || e.Invalid != nil && !strings.Contains(e.Invalid.Error(), c.invalid) {
			t.Fatalf("%+v: invalid %v", c, e.Invalid)
		}
	}
	for _, cfg := range []Config{{Layout: Layout{PartitionColumn: "at"}}, {Layout: Layout{TimestampColumn: "shard"}}, {Layout: Layout{PartitionColumn: "nope"}}} {
		d, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Decode(0x100, relationMsg(16384, "public", "outbox", cols)); err == nil {
			t.Fatalf("%+v: the Relation was accepted", cfg)
		}
	}
}

// TestTraceColumn: a traceparent, or Properties text with traceparent and
// tracestate (Debezium's tracingspancontext, with its escapes), becomes the
// traceparent and tracestate headers; a value without a valid traceparent
// gives none (TestTraceContextShapeAndSize has the shapes and sizes).
func TestTraceColumn(t *testing.T) {
	t.Parallel()
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	cols := []col{{Name: "id", OID: oidUUID}, {Name: "aggregatetype", OID: oidVarchar}, {Name: "aggregateid", OID: oidVarchar},
		{Name: "type", OID: oidVarchar}, {Name: "payload", OID: oidJSONB}, {Name: "trace", OID: oidText}}
	for _, c := range []struct {
		value         *string
		parent, state string
	}{
		{s(parent), parent, ""},
		{s("#Thu Dec 03 04:05:06 UTC 2026\ntraceparent=" + parent + "\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61rcWkgMzE\n"), parent, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"},
		{s("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-future"), parent, ""}, // a later version, in version 00's form
		{s("00-00000000000000000000000000000000-b7ad6b7169203331-01"), "", ""},            // an all-zero trace id
		{s("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), "", ""},            // version ff
		{s(parent + "-extra"), "", ""},  // version 00 has four fields
		{s("tracestate=a\\=b"), "", ""}, // no traceparent
		{nil, "", ""},
	} {
		d, err := New(Config{Layout: Layout{TraceColumn: "trace"}})
		if err != nil {
			t.Fatal(err)
		}
		mustDecode(t, d, relationMsg(16384, "public", "outbox", cols))
		mustDecode(t, d, beginMsg(0x5000, time.Now(), 1))
		e := mustDecode(t, d, insertMsg(16384, s(testID), s("order"), s("o-1"), s("T"), s("{}"), c.value)).(EventMessage)
		got := map[string]string{}
		for _, h := range e.Headers {
			got[h.Key] = string(h.Value)
		}
		if e.Invalid != nil || got["traceparent"] != c.parent || got["tracestate"] != c.state || len(got) != min(len(c.parent), 1)+min(len(c.state), 1) {
			t.Fatalf("%v: headers %v, invalid %v", c.value, got, e.Invalid)
		}
	}
}

// TestSeveralTables: each outbox table's rows are read by its own layout
// and carry its name as their Source; a table is known by its id even when
// renamed, by its name otherwise; a table of neither is still an error at
// its first row; a missing column names its table; a table listed twice, or
// a further table without a name, is refused.
func TestSeveralTables(t *testing.T) {
	t.Parallel()
	d, err := New(Config{
		Layout: Layout{RelationID: 100},
		More: []Layout{{Schema: "billing", Table: "events", HeaderColumns: []string{"tenant"},
			Columns: Columns{ID: "event_id", AggregateType: "kind", AggregateID: "account", Type: "event_type", Payload: "body"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	std := []col{{Name: "id", OID: oidUUID}, {Name: "aggregatetype", OID: oidVarchar}, {Name: "aggregateid", OID: oidVarchar},
		{Name: "type", OID: oidVarchar}, {Name: "payload", OID: oidJSONB}}
	billing := []col{{Name: "body", OID: oidText}, {Name: "tenant", OID: oidText}, {Name: "event_type", OID: oidText},
		{Name: "account", OID: oidText}, {Name: "kind", OID: oidText}, {Name: "event_id", OID: oidUUID}}
	mustDecode(t, d, relationMsg(100, "public", "renamed_outbox", std)) // by its id
	mustDecode(t, d, relationMsg(200, "billing", "events", billing))    // by its name
	mustDecode(t, d, relationMsg(300, "public", "other", std))
	mustDecode(t, d, beginMsg(0x5000, time.Now(), 1))
	a := mustDecode(t, d, insertMsg(100, s(testID), s("order"), s("o-1"), s("OrderCreated"), s("{}"))).(EventMessage)
	b := mustDecode(t, d, insertMsg(200, s("plain text"), s("t-1"), s("Invoiced"), s("a-1"), s("account"), s(testID))).(EventMessage)
	if a.Source != "public.outbox" || a.AggregateID != "o-1" || a.Index != 0 {
		t.Fatalf("outbox event: %+v", a.Event)
	}
	if b.Source != "billing.events" || b.ID != testID || b.AggregateType != "account" || b.AggregateID != "a-1" || b.Type != "Invoiced" ||
		string(b.Payload) != "plain text" || !b.PayloadText || len(b.Headers) != 1 || string(b.Headers[0].Value) != "t-1" || b.Index != 1 || b.Invalid != nil {
		t.Fatalf("billing event: %+v", b.Event)
	}
	if _, err := d.Decode(0x5100, insertMsg(300, s(testID), s("order"), s("o-1"), s("T"), s("{}"))); !errors.Is(err, ErrUnexpectedRelation) ||
		!strings.Contains(err.Error(), "public.outbox, billing.events") {
		t.Fatalf("a row of another table: %v", err)
	}
	if _, err := d.Decode(0x5200, relationMsg(200, "billing", "events", billing[1:])); !errors.Is(err, ErrMissingColumn) || !strings.Contains(err.Error(), "billing.events") {
		t.Fatalf("billing.events without its payload column: %v", err)
	}
	for _, cfg := range []Config{
		{More: []Layout{{Schema: "public", Table: "outbox"}}},
		{More: []Layout{{Table: "outbox"}}},
		{More: []Layout{{Schema: "billing"}}},
	} {
		if _, err := New(cfg); err == nil {
			t.Fatalf("%+v: accepted", cfg)
		}
	}
}

// TestReservedHeadersRefused: a header column published under the name
// of a header walrelay writes (id, type, walrelay.*, the CloudEvents ones,
// the trace headers when a trace column writes them), whatever its case,
// is refused: a consumer would read two values under one name.
func TestReservedHeadersRefused(t *testing.T) {
	t.Parallel()
	for _, l := range []Layout{
		{HeaderColumns: []string{"id"}},
		{HeaderColumns: []string{"correlation_id"}, HeaderNames: map[string]string{"correlation_id": "id"}},
		{HeaderColumns: []string{"Type"}},
		{HeaderColumns: []string{"tenant"}, HeaderNames: map[string]string{"tenant": "walrelay.table"}},
		{HeaderColumns: []string{"walrelay.lsn"}},
		{HeaderColumns: []string{"ce_id"}},
		{HeaderColumns: []string{"content-type"}},
		{HeaderColumns: []string{"traceparent"}, TraceColumn: "trace"},
	} {
		if _, err := New(Config{Layout: l}); err == nil || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("%+v: %v, want refused as reserved", l, err)
		}
		if err := (Config{More: []Layout{{Table: "more"}}, Layout: l}).Validate(); err == nil {
			t.Errorf("%+v: Validate accepted it", l)
		}
	}
	for _, l := range []Layout{
		{HeaderColumns: []string{"type"}, HeaderNames: map[string]string{"type": "eventType"}},
		{HeaderColumns: []string{"traceparent"}},
		{HeaderColumns: []string{"ce_tenant", "correlation_id"}},
	} {
		if _, err := New(Config{Layout: l}); err != nil {
			t.Errorf("%+v: %v", l, err)
		}
	}
}
