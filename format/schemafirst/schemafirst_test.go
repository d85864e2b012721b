package schemafirst

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

const orderAvro = `{"type":"record","name":"OrderCreated","namespace":"shop","fields":[
 {"name":"id","type":"long"},
 {"name":"qty","type":"int"},
 {"name":"price","type":"double"},
 {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID"]}},
 {"name":"note","type":["null","string"],"default":null},
 {"name":"currency","type":"string","default":"EUR"},
 {"name":"tags","type":{"type":"array","items":"string"},"default":[]},
 {"name":"attrs","type":{"type":"map","values":"long"},"default":{}},
 {"name":"ref","type":["null",{"type":"record","name":"Ref","fields":[{"name":"code","type":"string"}]},"long"],"default":null}
]}`

const orderProto = `syntax = "proto3";
package shop;
message Other { string x = 1; }
message OrderCreated {
  int64 id = 1;
  int32 qty = 2;
  string status = 3;
  repeated Line lines = 4;
  message Line { string sku = 1; int32 qty = 2; }
}
`

const orderJSONSchema = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",
 "properties":{"id":{"type":"integer"},"qty":{"type":"integer","minimum":1},"lines":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string"}},"required":["sku"]}}},
 "required":["id","qty"],"additionalProperties":false}`

// register registers a schema under subject in the real registry and
// returns its id.
func register(t *testing.T, cl *sr.Client, subject string, s sr.Schema) int {
	t.Helper()
	ss, err := cl.CreateSchema(t.Context(), subject, s)
	if err != nil {
		t.Fatalf("register %s: %v", subject, err)
	}
	return ss.ID
}

// schemaFirst is an encoder of kind against the registry at url.
func schemaFirst(t *testing.T, url string, cfg Config) *Encoder {
	t.Helper()
	s, err := New(mustRegistry(t, registry.Config{URL: url}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// wantMismatch asserts err is a mismatch at field.
func wantMismatch(t *testing.T, name string, err error, field string) {
	t.Helper()
	var me *MismatchError
	if !errors.As(err, &me) || !errors.Is(err, ErrMismatch) {
		t.Errorf("%s: %v, want a mismatch at %s", name, err, field)
		return
	}
	if me.Field != field {
		t.Errorf("%s: mismatch at %q (%v), want %q", name, me.Field, err, field)
	}
}

// TestRegistrySchemaFirstAvro (a real Apicurio Registry): a JSON payload is
// written in the Avro schema registered under its type (defaults filled,
// unions, enums, arrays, maps, nested records), with that schema's id, and
// decodes with the registry's schema by hamba's generic decoding; a
// payload missing a required field, with a field the schema lacks, a
// wrong type or an unknown symbol is a mismatch naming the field; an
// unregistered type is ErrNotRegistered; nothing is registered.
func TestRegistrySchemaFirstAvro(t *testing.T) {
	r := registrytest.Start(t)
	reg := mustRegistry(t, registry.Config{URL: r.URL()})
	id := register(t, reg.Client(), "OrderCreated", sr.Schema{Schema: orderAvro, Type: sr.TypeAvro})
	enc := schemaFirst(t, r.URL(), Config{Kind: KindAvro})
	ctx := t.Context()

	v, err := enc.Value(ctx, "orders", "OrderCreated", []byte(`{"id": 4294967296, "qty": 2, "price": 9.5, "status": "PAID", "note": "gift", "tags": ["a"], "attrs": {"w": 3}, "ref": {"code": "x"}}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	gotID, body, err := registry.Unframe(v)
	if err != nil || int(gotID) != id {
		t.Fatalf("framing: id %d %v, want %d", gotID, err, id)
	}
	ss, err := reg.Client().SchemaByID(ctx, int(gotID))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := avro.Unmarshal(avro.MustParse(ss.Schema), body, &got); err != nil {
		t.Fatal(err)
	}
	if got["id"] != int64(4294967296) || got["qty"] != 2 || got["price"] != 9.5 || got["status"] != "PAID" || got["currency"] != "EUR" {
		t.Errorf("decoded %v", got)
	}
	if got["note"] != "gift" { // hamba decodes a ["null", T] union to T
		t.Errorf("note %#v, want gift", got["note"])
	}
	if ref, ok := got["ref"].(map[string]any); !ok || ref["shop.Ref"].(map[string]any)["code"] != "x" {
		t.Errorf("ref %#v, want the record branch", got["ref"])
	}

	// Defaults: note null, tags [], attrs {}; a union's long branch.
	if _, err := enc.Value(ctx, "orders", "OrderCreated", []byte(`{"id": 1, "qty": 1, "price": 1, "status": "NEW", "ref": 7}`), 0); err != nil {
		t.Errorf("defaults: %v", err)
	}
	for _, c := range []struct{ name, payload, field string }{
		{"missing required", `{"id": 1, "price": 1, "status": "NEW"}`, "/qty"},
		{"unknown field", `{"id": 1, "qty": 1, "price": 1, "status": "NEW", "colour": "red"}`, "/colour"},
		{"wrong type", `{"id": 1, "qty": "two", "price": 1, "status": "NEW"}`, "/qty"},
		{"int overflow", `{"id": 1, "qty": 3000000000, "price": 1, "status": "NEW"}`, "/qty"},
		{"enum symbol", `{"id": 1, "qty": 1, "price": 1, "status": "LOST"}`, "/status"},
		{"array item", `{"id": 1, "qty": 1, "price": 1, "status": "NEW", "tags": ["a", 2]}`, "/tags/1"},
		{"union", `{"id": 1, "qty": 1, "price": 1, "status": "NEW", "ref": true}`, "/ref"},
		{"not JSON", `{"id": 1,`, ""},
	} {
		_, err := enc.Value(ctx, "orders", "OrderCreated", []byte(c.payload), 0)
		wantMismatch(t, c.name, err, c.field)
	}
	if _, err := enc.Value(ctx, "orders", "Unknown", []byte(`{}`), 0); !errors.Is(err, registry.ErrNotRegistered) {
		t.Errorf("an unregistered type: %v, want ErrNotRegistered", err)
	}
	// A new version registered: a payload that fits it alone makes an
	// encoder read the latest again (however recently it read the one it
	// knows, unless a mismatch made it read again within
	// MismatchReadInterval, as the ones above did enc), and it is written
	// with the new version's id.
	fresh := schemaFirst(t, r.URL(), Config{Kind: KindAvro})
	if _, err := fresh.Value(ctx, "orders", "OrderCreated", []byte(`{"id": 1, "qty": 1, "price": 1, "status": "NEW"}`), 0); err != nil {
		t.Fatal(err)
	}
	v2 := strings.Replace(orderAvro, `{"name":"id","type":"long"},`, `{"name":"id","type":"long"},{"name":"channel","type":"string","default":"web"},`, 1)
	id2 := register(t, reg.Client(), "OrderCreated", sr.Schema{Schema: v2, Type: sr.TypeAvro})
	newer := []byte(`{"id": 1, "qty": 1, "price": 1, "status": "NEW", "channel": "app"}`)
	if v, err := fresh.Value(ctx, "orders", "OrderCreated", newer, 0); err != nil {
		t.Errorf("a field of version 2: %v", err)
	} else if got, _, _ := registry.Unframe(v); int(got) != id2 {
		t.Errorf("a field of version 2: id %d, want %d", got, id2)
	}
	if subjects, _ := reg.Client().Subjects(ctx); len(subjects) != 1 {
		t.Errorf("subjects %v: want OrderCreated alone (nothing registered)", subjects)
	}
}

// TestRegistrySchemaFirstProtobuf (a real Apicurio Registry): a JSON
// payload is written in the Protobuf schema registered under
// <topic>-<type>, after Confluent's message indexes (a single 0 for the
// first message, [1] for the second, [1, 0] for a nested one), and
// decodes with the registry's .proto compiled afresh; an unknown field or
// a wrong type is a mismatch naming the field; a configured subject and
// version is used whatever the latest.
func TestRegistrySchemaFirstProtobuf(t *testing.T) {
	r := registrytest.Start(t)
	reg := mustRegistry(t, registry.Config{URL: r.URL()})
	id := register(t, reg.Client(), "orders-OrderCreated", sr.Schema{Schema: orderProto, Type: sr.TypeProtobuf})
	ctx := t.Context()

	payload := `{"id": "4294967296", "qty": 2, "status": "PAID", "lines": [{"sku": "a", "qty": 1}]}`
	for _, c := range []struct {
		message string
		index   []byte
	}{
		{"OrderCreated", []byte{2, 2}}, // [1]: count 1, index 1 (zigzag)
		{"shop.OrderCreated.Line", []byte{4, 2, 0}},
	} {
		enc := schemaFirst(t, r.URL(), Config{Kind: KindProtobuf, Strategy: registry.StrategyTopicType, Message: c.message})
		in := payload
		if c.message != "OrderCreated" {
			in = `{"sku": "b", "qty": 3}`
		}
		v, err := enc.Value(ctx, "orders", "OrderCreated", []byte(in), 0)
		if err != nil {
			t.Fatalf("%s: %v", c.message, err)
		}
		gotID, body, _ := registry.Unframe(v)
		if int(gotID) != id || !bytes.HasPrefix(body, c.index) {
			t.Fatalf("%s: id %d, body % x: want id %d, indexes % x", c.message, gotID, body, id, c.index)
		}
		got := decodeProto(t, reg.Client(), int(gotID), strings.TrimPrefix(c.message, "shop."), body[len(c.index):])
		if !jsonEqual(t, got, in) {
			t.Errorf("%s: decoded %s, want %s", c.message, got, in)
		}
	}

	enc := schemaFirst(t, r.URL(), Config{Kind: KindProtobuf, Strategy: registry.StrategyTopicType, Message: "OrderCreated"})
	for _, c := range []struct{ name, payload, field string }{
		{"unknown field", `{"id": "1", "colour": "red"}`, "/colour"},
		{"wrong type", `{"id": "1", "qty": "two"}`, "/qty"},
	} {
		_, err := enc.Value(ctx, "orders", "OrderCreated", []byte(c.payload), 0)
		wantMismatch(t, c.name, err, c.field)
	}

	// The first message: [0] is the single byte 0. A fixed subject and
	// version: version 1 after a version 2 was registered.
	first := `syntax = "proto3"; package shop; message Ping { string at = 1; }`
	register(t, reg.Client(), "pings", sr.Schema{Schema: first, Type: sr.TypeProtobuf})
	register(t, reg.Client(), "pings", sr.Schema{Schema: first + ` message Pong { string at = 1; }`, Type: sr.TypeProtobuf})
	pinned := schemaFirst(t, r.URL(), Config{Kind: KindProtobuf, Strategy: registry.StrategySubject, Subject: "pings", Version: 1})
	v, err := pinned.Value(ctx, "any", "", []byte(`{"at": "now"}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, body, _ := registry.Unframe(v); body[0] != 0 {
		t.Errorf("first message: indexes % x, want 00", body[:1])
	}
	if _, version, err := pinned.Check(ctx, "pings"); err != nil || version != 1 {
		t.Errorf("check pings version 1: version %d %v", version, err)
	}
	// A format of another kind than the subject's schema.
	avroEnc := schemaFirst(t, r.URL(), Config{Kind: KindAvro, Strategy: registry.StrategySubject, Subject: "pings"})
	if _, err := avroEnc.Value(ctx, "any", "", []byte(`{}`), 0); !errors.Is(err, registry.ErrNotRegistered) {
		t.Errorf("avro from a Protobuf subject: %v, want ErrNotRegistered", err)
	}
}

// decodeProto decodes body as message of the schema with id, compiled
// afresh with protocompile (not the encoder's path), to protojson.
func decodeProto(t *testing.T, cl *sr.Client, id int, message string, body []byte) string {
	t.Helper()
	s, err := cl.SchemaByID(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	c := protocompile.Compiler{Resolver: &protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(map[string]string{"x.proto": s.Schema})}}
	files, err := c.Compile(context.Background(), "x.proto")
	if err != nil {
		t.Fatal(err)
	}
	d, ok := files[0].FindDescriptorByName(protoreflect.FullName("shop." + message)).(protoreflect.MessageDescriptor)
	if !ok {
		t.Fatalf("no message %s", message)
	}
	m := dynamicpb.NewMessage(d)
	if err := proto.Unmarshal(body, m); err != nil {
		t.Fatal(err)
	}
	out, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// jsonEqual reports whether two JSON texts hold the same value.
func jsonEqual(t *testing.T, a, b string) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal([]byte(a), &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal([]byte(b), &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}

// TestRegistrySchemaFirstJSONSchema (a real Apicurio Registry): a payload
// valid in the JSON Schema registered under its type is written as it is,
// after Confluent's framing with that schema's id; an invalid one is a
// mismatch naming the JSON pointer of the value at fault.
func TestRegistrySchemaFirstJSONSchema(t *testing.T) {
	r := registrytest.Start(t)
	reg := mustRegistry(t, registry.Config{URL: r.URL()})
	id := register(t, reg.Client(), "OrderCreated", sr.Schema{Schema: orderJSONSchema, Type: sr.TypeJSON})
	enc := schemaFirst(t, r.URL(), Config{Kind: KindJSONSchema})
	ctx := t.Context()
	in := `{"id": 7, "qty": 2, "lines": [{"sku": "a"}]}`
	v, err := enc.Value(ctx, "orders", "OrderCreated", []byte(in), 0)
	if err != nil {
		t.Fatal(err)
	}
	if gotID, body, _ := registry.Unframe(v); int(gotID) != id || string(body) != in {
		t.Errorf("id %d body %s, want %d %s", gotID, body, id, in)
	}
	for _, c := range []struct{ name, payload, field string }{
		{"missing required", `{"id": 7}`, ""},
		{"minimum", `{"id": 7, "qty": 0}`, "/qty"},
		{"nested", `{"id": 7, "qty": 1, "lines": [{"sku": "a"}, {"sku": 3}]}`, "/lines/1/sku"},
		{"additional", `{"id": 7, "qty": 1, "colour": "red"}`, ""},
	} {
		_, err := enc.Value(ctx, "orders", "OrderCreated", []byte(c.payload), 0)
		wantMismatch(t, c.name, err, c.field)
		if c.name == "missing required" && err != nil && !strings.Contains(err.Error(), "qty") {
			t.Errorf("missing required: %v does not name qty", err)
		}
		if c.name == "additional" && err != nil && !strings.Contains(err.Error(), "colour") {
			t.Errorf("additional: %v does not name colour", err)
		}
	}
}

// TestMessageIndexes: Confluent's message indexes, [0] as the single byte
// 0, else the count and each index as zigzag varints.
func TestMessageIndexes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   []int
		want []byte
	}{
		{[]int{0}, []byte{0}},
		{[]int{1}, []byte{2, 2}},
		{[]int{1, 0}, []byte{4, 2, 0}},
		{[]int{0, 2}, []byte{4, 0, 4}},
		{[]int{64}, []byte{2, 0x80, 0x01}},
	} {
		if got := AppendMessageIndexes(nil, c.in); !bytes.Equal(got, c.want) {
			t.Errorf("%v: % x, want % x", c.in, got, c.want)
		}
	}
}

// TestMessageByIndexes: the message indexes that AppendMessageIndexes
// writes read back (SplitMessageIndexes) to the message they were taken
// from (MessageByIndexes), every message of a file with nested ones; and
// indexes that are truncated, negative, too many or out of the file's
// messages are errors, never a panic.
func TestMessageByIndexes(t *testing.T) {
	t.Parallel()
	fd, err := CompileProtobuf(t.Context(), orderProto, nil)
	if err != nil {
		t.Fatal(err)
	}
	var walk func(ms protoreflect.MessageDescriptors)
	n := 0
	walk = func(ms protoreflect.MessageDescriptors) {
		for i := range ms.Len() {
			md := ms.Get(i)
			b := append(AppendMessageIndexes(nil, MessageIndexes(md)), 0xaa)
			idx, rest, err := SplitMessageIndexes(b)
			if err != nil || !bytes.Equal(rest, []byte{0xaa}) {
				t.Errorf("%s: %v %x %v", md.FullName(), idx, rest, err)
				continue
			}
			got, err := MessageByIndexes(fd, idx)
			if err != nil || got.FullName() != md.FullName() {
				t.Errorf("%s: indexes %v name %v, %v", md.FullName(), idx, got, err)
			}
			n++
			walk(md.Messages())
		}
	}
	walk(fd.Messages())
	if n != 3 {
		t.Errorf("%d messages, want 3", n)
	}
	for _, c := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"truncated count", []byte{0x80}},
		{"truncated index", []byte{4, 2}},
		{"negative count", []byte{1}},
		{"too many", []byte{0xfe, 0x03}},
	} {
		if _, _, err := SplitMessageIndexes(c.b); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
	for _, idx := range [][]int{{2}, {-1}, {1, 1}, {0, 0}, {1, 0, 0}, {}} {
		if md, err := MessageByIndexes(fd, idx); err == nil {
			t.Errorf("%v: %v, want an error", idx, md.FullName())
		}
	}
}

// TestCheckStrategy: the subject strategies and what they need.
func TestCheckStrategy(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		strategy, subject string
		version           int
		ok                bool
	}{
		{"type", "", Latest, true},
		{"topic_type", "", 0, true},
		{"subject", "orders", 3, true},
		{"subject", "", Latest, false},
		{"type", "orders", Latest, false},
		{"type", "", 2, false},
		{"record", "", Latest, false},
	} {
		if err := CheckStrategy(c.strategy, c.subject, c.version); (err == nil) != c.ok {
			t.Errorf("%s %q %d: %v, want ok %v", c.strategy, c.subject, c.version, err, c.ok)
		}
	}
}

// TestSchemaFirstMismatches (no registry: the schemas compiled as the
// encoder compiles the registry's): each format's mismatch names the
// field as a JSON pointer and says why.
func TestSchemaFirstMismatches(t *testing.T) {
	t.Parallel()
	mismatch := func(field, reason string) *MismatchError {
		return &MismatchError{Subject: "s", Version: 1, Field: field, Reason: reason}
	}
	avroW, err := uncapped(compileAvro(orderAvro, nil, mismatch))
	if err != nil {
		t.Fatal(err)
	}
	protoW, err := compileProtobuf(t.Context(), orderProto, nil, "OrderCreated", mismatch)
	if err != nil {
		t.Fatal(err)
	}
	jsonW, err := compileJSONSchema(orderJSONSchema, nil, mismatch)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		write   func(dst, payload []byte) ([]byte, *MismatchError)
		payload string
		field   string
		reason  string
	}{
		{"avro missing", avroW, `{"id": 1, "qty": 1, "price": 1}`, "/status", "missing: the field status of the record shop.OrderCreated is required"},
		{"avro map value", avroW, `{"id": 1, "qty": 1, "price": 1, "status": "NEW", "attrs": {"a/b": "x"}}`, "/attrs/a~1b", "want long, got a string"},
		{"avro fixed-point", avroW, `{"id": 1.5, "qty": 1, "price": 1, "status": "NEW"}`, "/id", "want long, got 1.5"},
		{"protobuf nested", protoW, `{"lines": [{"sku": 1}]}`, "/sku", "invalid value for string field sku"},
		{"protobuf not JSON", protoW, `{`, "", "unexpected"},
		{"jsonschema type", jsonW, `{"id": 1, "qty": 1, "lines": [{"sku": 2}]}`, "/lines/0/sku", "want string"},
		{"jsonschema required", jsonW, `{"id": 1}`, "", "missing property 'qty'"},
	} {
		_, me := c.write(nil, []byte(c.payload))
		if me == nil || me.Field != c.field || !strings.Contains(me.Reason, c.reason) {
			t.Errorf("%s: %v, want field %q and %q", c.name, me, c.field, c.reason)
		}
	}
	// A payload that fits: framing left to the caller, the body appended.
	if b, me := protoW([]byte{9}, []byte(`{"id": "1", "lines": [{"sku": "a"}]}`)); me != nil || b[0] != 9 || b[1] != 2 || b[2] != 2 {
		t.Errorf("protobuf: % x %v, want 09 then indexes 02 02", b, me)
	}
}

// TestClip: a mismatch's reason, which may quote the payload, is cut to
// maxReason bytes on a character boundary.
func TestClip(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 400)
	got := clip(long)
	if len(got) > maxReason+len("…") || !strings.HasSuffix(got, "…") || !utf8.ValidString(got) {
		t.Errorf("clip: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	if clip("short") != "short" {
		t.Error("a short reason was cut")
	}
}

// TestJSONSchemaCheckedAgainstItsDraft: a JSON Schema that its draft's
// metaschema refuses is refused at compile time, for each draft.
func TestJSONSchemaCheckedAgainstItsDraft(t *testing.T) {
	t.Parallel()
	mismatch := func(field, reason string) *MismatchError { return &MismatchError{Field: field, Reason: reason} }
	tests := []struct{ name, schema string }{
		{"default (2020-12)", `{"type": 5}`},
		{"2020-12", `{"$schema": "https://json-schema.org/draft/2020-12/schema", "minLength": "x"}`},
		{"2019-09", `{"$schema": "https://json-schema.org/draft/2019-09/schema", "required": "id"}`},
		{"draft-07", `{"$schema": "http://json-schema.org/draft-07/schema#", "properties": []}`},
		{"draft-06", `{"$schema": "http://json-schema.org/draft-06/schema#", "maxItems": -1}`},
		{"draft-04", `{"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "multipleOf": 0}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := compileJSONSchema(tt.schema, nil, mismatch); err == nil {
				t.Fatalf("%s compiled: want it refused by its draft's metaschema", tt.schema)
			}
		})
	}
}
