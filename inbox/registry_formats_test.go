package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/format/schemafirst"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

// The Protobuf schema of the tests: it imports a file that the registry
// holds under a subject of its own (a schema reference).
const (
	moneyProto = `syntax = "proto3";
package shop.common;
message Money { string currency = 1; int64 units = 2; }
`
	orderProto = `syntax = "proto3";
package shop;
import "shop/common/money.proto";
message Other { string x = 1; }
message OrderCreated {
  int64 id = 1;
  int32 qty = 2;
  repeated Line lines = 3;
  shop.common.Money total = 4;
  message Line { string sku = 1; int32 qty = 2; }
}
`
	// A schema whose message is Google's Duration: decoded into the
	// generated *durationpb.Duration.
	durationProto = `syntax = "proto3"; package google.protobuf; message Duration { int64 seconds = 1; int32 nanos = 2; }`

	lineJSONSchema  = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"sku":{"type":"string"}},"required":["sku"]}`
	orderJSONSchema = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",
 "properties":{"id":{"type":"integer"},"qty":{"type":"integer","minimum":1},"lines":{"type":"array","items":{"$ref":"line.json"}}},
 "required":["id","qty"]}`
)

// registerSchema registers s under subject in the real registry and
// returns its id.
func registerSchema(t *testing.T, cl *sr.Client, subject string, s sr.Schema) uint32 {
	t.Helper()
	ss, err := cl.CreateSchema(t.Context(), subject, s)
	if err != nil {
		t.Fatalf("register %s: %v", subject, err)
	}
	return uint32(ss.ID)
}

// compileOwn compiles the test's own copy of a .proto (not inbox's or
// format's path) and returns its message name.
func compileOwn(t *testing.T, files map[string]string, name string) protoreflect.MessageDescriptor {
	t.Helper()
	c := protocompile.Compiler{Resolver: &protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(files)}}
	fds, err := c.Compile(context.Background(), "main.proto")
	if err != nil {
		t.Fatal(err)
	}
	md, ok := fds[0].FindDescriptorByName(protoreflect.FullName(name)).(protoreflect.MessageDescriptor)
	if !ok {
		t.Fatalf("no message %s", name)
	}
	return md
}

// TestRegistryDecodeProtobuf (a real Apicurio Registry:
// WALRELAY_TEST_REGISTRY=1): values that walrelay's registered_protobuf
// format wrote, and values that the test framed itself (franz-go's
// Confluent header, its own compile of the .proto), decode with the
// schema (and the schema it imports) that the registry gives for their
// id: Decoded's id, type, message and value, whose JSON is the payload;
// into a map, a struct, a dynamicpb message and a generated message. A
// message of another name, indexes naming no message, a truncated header,
// bytes that are no Protobuf, an unknown id are ErrUndecodable; a
// registry that does not answer is ErrRegistryUnavailable, and a schema
// decoded once is served from the cache while it is away.
func TestRegistryDecodeProtobuf(t *testing.T) {
	r := registrytest.Start(t)
	ctx := t.Context()
	w, err := registry.New(registry.Config{URL: r.URL()})
	if err != nil {
		t.Fatal(err)
	}
	cl := w.Client()
	registerSchema(t, cl, "shop-common-money", sr.Schema{Schema: moneyProto, Type: sr.TypeProtobuf})
	id := registerSchema(t, cl, "orders-OrderCreated", sr.Schema{Schema: orderProto, Type: sr.TypeProtobuf,
		References: []sr.SchemaReference{{Name: "shop/common/money.proto", Subject: "shop-common-money", Version: 1}}})
	px := r.Proxy(t)
	reg, err := NewRegistry(RegistryConfig{URL: "http://" + px.Addr() + registrytest.CCompatPath})
	if err != nil {
		t.Fatal(err)
	}

	// Down before the schema was ever fetched: retry, not a dead letter.
	enc, err := schemafirst.New(w, schemafirst.Config{Kind: schemafirst.KindProtobuf, Strategy: registry.StrategyTopicType, Message: "OrderCreated"})
	if err != nil {
		t.Fatal(err)
	}
	payload := `{"id": "4294967296", "qty": 2, "lines": [{"sku": "a", "qty": 1}], "total": {"currency": "EUR", "units": "12"}}`
	v, err := enc.Value(ctx, "orders", "OrderCreated", []byte(payload), 0)
	if err != nil {
		t.Fatal(err)
	}
	px.Down()
	if _, err := reg.Decoded(ctx, v); !errors.Is(err, ErrRegistryUnavailable) || errors.Is(err, ErrUndecodable) {
		t.Fatalf("registry down: %v, want ErrRegistryUnavailable", err)
	}
	px.Up()

	// walrelay's registered_protobuf value.
	d, err := reg.Decoded(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	if d.ID != id || d.Type != Protobuf || d.Message != "shop.OrderCreated" {
		t.Fatalf("decoded id %d type %s message %s, want %d PROTOBUF shop.OrderCreated", d.ID, d.Type, d.Message, id)
	}
	if _, ok := d.Value.(*dynamicpb.Message); !ok {
		t.Fatalf("value %T, want *dynamicpb.Message", d.Value)
	}
	js, err := d.JSON()
	if err != nil || !jsonEqual(t, string(js), payload) {
		t.Errorf("JSON %s %v, want %s", js, err, payload)
	}
	var asMap map[string]any
	if err := reg.Decode(ctx, v, &asMap); err != nil || !jsonEqual(t, mustJSON(t, asMap), payload) {
		t.Errorf("into a map: %v %v", asMap, err)
	}
	var order struct {
		ID    string `json:"id"` // protojson writes an int64 as a string
		Qty   int    `json:"qty"`
		Lines []struct {
			SKU string `json:"sku"`
		} `json:"lines"`
		Total struct {
			Currency string `json:"currency"`
		} `json:"total"`
	}
	if err := reg.Decode(ctx, v, &order); err != nil || order.ID != "4294967296" || order.Qty != 2 || len(order.Lines) != 1 || order.Lines[0].SKU != "a" || order.Total.Currency != "EUR" {
		t.Errorf("into a struct: %+v %v", order, err)
	}
	own := map[string]string{"main.proto": orderProto, "shop/common/money.proto": moneyProto}
	dm := dynamicpb.NewMessage(compileOwn(t, own, "shop.OrderCreated"))
	if err := reg.Decode(ctx, v, dm); err != nil || dm.Get(dm.Descriptor().Fields().ByName("id")).Int() != 4294967296 {
		t.Errorf("into a dynamicpb message: %v %v", dm, err)
	}

	// Cached: decoded while the registry is away.
	px.Down()
	if _, err := reg.Decoded(ctx, v); err != nil {
		t.Errorf("a cached schema with the registry down: %v", err)
	}
	px.Up()

	// Framed by the test itself: the nested message Line, [1, 0].
	line := dynamicpb.NewMessage(compileOwn(t, own, "shop.OrderCreated.Line"))
	if err := protojson.Unmarshal([]byte(`{"sku": "b", "qty": 3}`), line); err != nil {
		t.Fatal(err)
	}
	body, err := proto.Marshal(line)
	if err != nil {
		t.Fatal(err)
	}
	var h sr.ConfluentHeader
	framed, err := h.AppendEncode(nil, int(id), []int{1, 0})
	if err != nil {
		t.Fatal(err)
	}
	framed = append(framed, body...)
	if d, err := reg.Decoded(ctx, framed); err != nil || d.Message != "shop.OrderCreated.Line" {
		t.Errorf("the test's Line: %+v %v", d, err)
	} else if js, _ := d.JSON(); !jsonEqual(t, string(js), `{"sku": "b", "qty": 3}`) {
		t.Errorf("the test's Line: %s", js)
	}

	// A generated message: Google's Duration, by the schema of that name.
	durID := registerSchema(t, cl, "durations", sr.Schema{Schema: durationProto, Type: sr.TypeProtobuf})
	body, err = proto.Marshal(durationpb.New(90e9))
	if err != nil {
		t.Fatal(err)
	}
	durValue, _ := h.AppendEncode(nil, int(durID), []int{0})
	durValue = append(durValue, body...)
	var dur durationpb.Duration
	if err := reg.Decode(ctx, durValue, &dur); err != nil || dur.Seconds != 90 {
		t.Errorf("into *durationpb.Duration: %v %v", &dur, err)
	}
	var durp *durationpb.Duration // a pointer to a nil message: allocated
	if err := reg.Decode(ctx, durValue, &durp); err != nil || durp.GetSeconds() != 90 {
		t.Errorf("into **durationpb.Duration: %v %v", durp, err)
	}

	// Errors: never a panic, each undecodable, saying why.
	frame := func(index []int, body []byte) []byte {
		b, _ := h.AppendEncode(nil, int(id), index)
		return append(b, body...)
	}
	for _, c := range []struct {
		name string
		b    []byte
		into any
		want string
	}{
		{"another message", v, &dur, "cannot decode it into a google.protobuf.Duration"},
		{"index out of the file", frame([]int{7}, body), nil, "no index 7"},
		{"nested index out", frame([]int{1, 3}, body), nil, "no index 3"},
		{"negative index", frame([]int{-1}, body), nil, "no index -1"},
		{"no indexes", registry.Frame(nil, id, nil), nil, "message indexes"},
		{"truncated indexes", registry.Frame(nil, id, []byte{4, 2}), nil, "message indexes"},
		{"negative count", registry.Frame(nil, id, []byte{1}), nil, "message indexes"},
		{"too many indexes", registry.Frame(nil, id, []byte{0xfe, 0x03}), nil, "message indexes"},
		{"not Protobuf", frame([]int{1}, []byte{0xff, 0xff, 0xff}), nil, "decode the Protobuf message"},
		{"not framed", []byte(`{"id": 1}`), nil, "wire format"},
		{"tombstone", nil, nil, "wire format"},
		{"unknown id", registry.Frame(nil, durID+1000, []byte{0}), nil, "no schema"},
	} {
		var err error
		if c.into != nil {
			err = reg.Decode(ctx, c.b, c.into)
		} else {
			_, err = reg.Decoded(ctx, c.b)
		}
		t.Logf("%s: %v", c.name, err)
		if !errors.Is(err, ErrUndecodable) || errors.Is(err, ErrRegistryUnavailable) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrUndecodable saying %q", c.name, err, c.want)
		}
	}
	if _, err := reg.Decoded(ctx, registry.Frame(nil, durID+1000, []byte{0})); !errors.Is(err, registry.ErrSchemaUnknown) || strings.Count(err.Error(), "schema id") != 1 {
		t.Errorf("unknown id: %v, want registry.ErrSchemaUnknown, the id named once", err)
	}
}

// TestRegistryDecodeJSONSchema (a real Apicurio Registry): a value that
// walrelay's registered_jsonschema format wrote, and one the test framed
// itself, decode into plain values and a struct, with the id and type;
// with ValidateJSON, one invalid in its schema (which references
// another) is ErrUndecodable naming the field, and without it decodes as
// it is; a body that is not JSON is ErrUndecodable.
func TestRegistryDecodeJSONSchema(t *testing.T) {
	r := registrytest.Start(t)
	ctx := t.Context()
	w, err := registry.New(registry.Config{URL: r.URL()})
	if err != nil {
		t.Fatal(err)
	}
	registerSchema(t, w.Client(), "line", sr.Schema{Schema: lineJSONSchema, Type: sr.TypeJSON})
	id := registerSchema(t, w.Client(), "OrderCreated", sr.Schema{Schema: orderJSONSchema, Type: sr.TypeJSON,
		References: []sr.SchemaReference{{Name: "line.json", Subject: "line", Version: 1}}})
	enc, err := schemafirst.New(w, schemafirst.Config{Kind: schemafirst.KindJSONSchema})
	if err != nil {
		t.Fatal(err)
	}
	payload := `{"id": 7, "qty": 2, "lines": [{"sku": "a"}]}`
	v, err := enc.Value(ctx, "orders", "OrderCreated", []byte(payload), 0)
	if err != nil {
		t.Fatal(err)
	}
	validating, err := NewRegistry(RegistryConfig{URL: r.URL(), ValidateJSON: true})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := NewRegistry(RegistryConfig{URL: r.URL()})
	if err != nil {
		t.Fatal(err)
	}
	for _, reg := range []*Registry{validating, plain} {
		d, err := reg.Decoded(ctx, v)
		if err != nil || d.ID != id || d.Type != JSONSchema || d.Message != "" ||
			!reflect.DeepEqual(d.Value, map[string]any{"id": 7.0, "qty": 2.0, "lines": []any{map[string]any{"sku": "a"}}}) {
			t.Fatalf("decoded %+v %v", d, err)
		}
		if js, err := d.JSON(); err != nil || string(js) != payload {
			t.Errorf("JSON %s %v", js, err)
		}
		var o struct {
			ID    int64 `json:"id"`
			Lines []struct {
				SKU string `json:"sku"`
			} `json:"lines"`
		}
		if err := (Message{Value: v, reg: reg}).Decode(ctx, &o); err != nil || o.ID != 7 || len(o.Lines) != 1 || o.Lines[0].SKU != "a" {
			t.Errorf("into a struct: %+v %v", o, err)
		}
	}

	// Framed by the test: invalid in the referenced schema.
	bad := registry.Frame(nil, id, []byte(`{"id": 8, "qty": 1, "lines": [{"sku": 3}]}`))
	if _, err := validating.Decoded(ctx, bad); !errors.Is(err, ErrUndecodable) || !strings.Contains(err.Error(), "/lines/0/sku") {
		t.Errorf("invalid, validated: %v, want ErrUndecodable at /lines/0/sku", err)
	}
	if d, err := plain.Decoded(ctx, bad); err != nil || d.Value.(map[string]any)["id"] != 8.0 {
		t.Errorf("invalid, not validated: %+v %v", d, err)
	}
	for _, reg := range []*Registry{validating, plain} {
		if _, err := reg.Decoded(ctx, registry.Frame(nil, id, []byte(`{"id": `))); !errors.Is(err, ErrUndecodable) {
			t.Errorf("not JSON: %v, want ErrUndecodable", err)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRegistryDecodeAvroReferences (a real Apicurio Registry): an Avro
// value whose schema's named types come from the registry's references
// (a record, and an enum that record references in turn) is decoded with
// them; the test frames the value itself, with the three schemas parsed
// together by hamba.
func TestRegistryDecodeAvroReferences(t *testing.T) {
	const (
		country  = `{"type":"enum","name":"Country","namespace":"shop","symbols":["FR","DE"]}`
		address  = `{"type":"record","name":"Address","namespace":"shop","fields":[{"name":"street","type":"string"},{"name":"country","type":"shop.Country"}]}`
		shipment = `{"type":"record","name":"Shipment","namespace":"shop","fields":[{"name":"ship_to","type":"shop.Address"}]}`
	)
	r := registrytest.Start(t)
	reg, err := NewRegistry(RegistryConfig{URL: r.URL()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := registry.New(registry.Config{URL: r.URL()})
	if err != nil {
		t.Fatal(err)
	}
	cl := w.Client()
	registerSchema(t, cl, "shop.Country", sr.Schema{Schema: country, Type: sr.TypeAvro})
	registerSchema(t, cl, "shop.Address", sr.Schema{Schema: address, Type: sr.TypeAvro,
		References: []sr.SchemaReference{{Name: "shop.Country", Subject: "shop.Country", Version: 1}}})
	id := registerSchema(t, cl, "Shipment", sr.Schema{Schema: shipment, Type: sr.TypeAvro,
		References: []sr.SchemaReference{{Name: "shop.Address", Subject: "shop.Address", Version: 1}}})

	cache := &avro.SchemaCache{}
	var schema avro.Schema
	for _, s := range []string{country, address, shipment} {
		if schema, err = avro.ParseWithCache(s, "", cache); err != nil {
			t.Fatal(err)
		}
	}
	body, err := avro.Marshal(schema, map[string]any{"ship_to": map[string]any{"street": "1 rue A", "country": "DE"}})
	if err != nil {
		t.Fatal(err)
	}
	var h sr.ConfluentHeader
	value, err := h.AppendEncode(nil, int(id), nil)
	if err != nil {
		t.Fatal(err)
	}
	value = append(value, body...)

	d, err := reg.Decoded(t.Context(), value)
	if err != nil {
		t.Fatalf("decode a value whose schema has references: %v", err)
	}
	want := map[string]any{"ship_to": map[string]any{"street": "1 rue A", "country": "DE"}}
	if d.ID != id || d.Type != Avro || !reflect.DeepEqual(d.Value, want) {
		t.Errorf("decoded id %d type %s value %#v, want id %d avro %#v", d.ID, d.Type, d.Value, id, want)
	}
}
