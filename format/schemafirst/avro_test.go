package schemafirst

import (
	"bytes"
	"encoding/binary"
	"math/big"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

// paymentAvro has a field of every logical type that registered_avro
// writes.
const paymentAvro = `{"type":"record","name":"Payment","namespace":"shop","fields":[
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
 {"name":"fee","type":{"type":"fixed","name":"Fee","size":4,"logicalType":"decimal","precision":7,"scale":3}},
 {"name":"id","type":{"type":"string","logicalType":"uuid"}},
 {"name":"day","type":{"type":"int","logicalType":"date"}},
 {"name":"at_ms","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"at_us","type":{"type":"long","logicalType":"timestamp-micros"}},
 {"name":"local_ms","type":{"type":"long","logicalType":"local-timestamp-millis"}},
 {"name":"local_us","type":{"type":"long","logicalType":"local-timestamp-micros"}},
 {"name":"t_ms","type":{"type":"int","logicalType":"time-millis"}},
 {"name":"t_us","type":{"type":"long","logicalType":"time-micros"}},
 {"name":"span","type":{"type":"fixed","name":"Span","size":12,"logicalType":"duration"}},
 {"name":"maybe","type":["null",{"type":"long","logicalType":"timestamp-millis"}],"default":null}
]}`

// logicalTypeProp matches a logical type and its decimal properties in a
// schema's text: without them, the schema reads the underlying values.
var logicalTypeProp = regexp.MustCompile(`,"logicalType":"[a-z-]+"(,"precision":\d+,"scale":\d+)?`)

// le12 is a duration's 12 bytes: months, days, milliseconds, each a
// little-endian uint32.
func le12(months, days, millis uint32) [12]byte {
	var b [12]byte
	binary.LittleEndian.PutUint32(b[0:], months)
	binary.LittleEndian.PutUint32(b[4:], days)
	binary.LittleEndian.PutUint32(b[8:], millis)
	return b
}

// TestRegistrySchemaFirstAvroLogicalTypes (a real Apicurio Registry): a
// JSON payload is written in an Avro schema with logical types, each from
// what an application's JSON holds (a decimal from a number or a string,
// exactly; dates, times and timestamps from ISO-8601 strings or numbers; a
// duration from ISO-8601), and decodes both with hamba's generic decoding
// of the logical types and, with the logical types taken out of the
// schema, to the underlying values the test computes on its own (a
// decimal's unscaled big-endian two's-complement bytes included).
func TestRegistrySchemaFirstAvroLogicalTypes(t *testing.T) {
	r := registrytest.Start(t)
	reg := mustRegistry(t, registry.Config{URL: r.URL()})
	id := register(t, reg.Client(), "Payment", sr.Schema{Schema: paymentAvro, Type: sr.TypeAvro})
	enc := schemaFirst(t, r.URL(), Config{Kind: KindAvro})
	ctx := t.Context()
	plain := avro.MustParse(logicalTypeProp.ReplaceAllString(paymentAvro, ""))
	at := time.Date(2024, 2, 29, 10, 34, 56, 789_000_000, time.UTC)
	for _, c := range []struct {
		name    string
		payload string
		want    map[string]any // the underlying values
	}{{
		name: "strings",
		payload: `{"amount": "-1234.5", "fee": "12.5", "id": "0191d8a2-7c3e-7a51-8e2b-3f6c1d9e0a47", "day": "2024-02-29",
			"at_ms": "2024-02-29T12:34:56.789+02:00", "at_us": "2024-02-29T10:34:56.789123Z", "local_ms": "2024-02-29T12:34:56.789",
			"local_us": "2024-02-29 12:34:56.789123", "t_ms": "12:34:56.789", "t_us": "12:34:56.789123", "span": "P1Y2M3DT4H5M6.007S",
			"maybe": "2024-02-29T10:34:56.789Z"}`,
		want: map[string]any{
			"amount": []byte{0xfe, 0x1d, 0xc6},  // -123450
			"fee":    [4]byte{0, 0, 0x30, 0xd4}, // 12500
			"id":     "0191d8a2-7c3e-7a51-8e2b-3f6c1d9e0a47",
			"day":    19782,
			"at_ms":  at.UnixMilli(), "at_us": at.UnixMicro() + 123,
			"local_ms": time.Date(2024, 2, 29, 12, 34, 56, 789_000_000, time.UTC).UnixMilli(),
			"local_us": time.Date(2024, 2, 29, 12, 34, 56, 789_123_000, time.UTC).UnixMicro(),
			"t_ms":     45296789, "t_us": int64(45296789123),
			"span":  le12(14, 3, 14706007),
			"maybe": at.UnixMilli(),
		},
	}, {
		name: "numbers",
		payload: `{"amount": 0.1, "fee": -0.001, "id": "0191D8A2-7C3E-7A51-8E2B-3F6C1D9E0A47", "day": 19782,
			"at_ms": 1709202896789, "at_us": 1709202896789123, "local_ms": 5, "local_us": -5, "t_ms": 0, "t_us": 86399999999,
			"span": "P2W", "maybe": null}`,
		want: map[string]any{
			"amount": []byte{0x0a},
			"fee":    [4]byte{0xff, 0xff, 0xff, 0xff},
			"id":     "0191D8A2-7C3E-7A51-8E2B-3F6C1D9E0A47",
			"day":    19782,
			"at_ms":  int64(1709202896789), "at_us": int64(1709202896789123),
			"local_ms": int64(5), "local_us": int64(-5),
			"t_ms": 0, "t_us": int64(86399999999),
			"span":  le12(0, 14, 0),
			"maybe": nil,
		},
	}, {
		name:    "decimal zero, a power of ten, and trailing zeros",
		payload: `{"amount": "1.280e2", "fee": "0", "id": "0191d8a2-7c3e-7a51-8e2b-3f6c1d9e0a47", "day": 0, "at_ms": 0, "at_us": 0, "local_ms": 0, "local_us": 0, "t_ms": 0, "t_us": 0, "span": "PT0S"}`,
		want: map[string]any{
			"amount": []byte{0x32, 0x00}, // 12800
			"fee":    [4]byte{},
			"day":    0, "at_ms": int64(0),
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			v, err := enc.Value(ctx, "payments", "Payment", []byte(c.payload), 0)
			if err != nil {
				t.Fatal(err)
			}
			gotID, body, err := registry.Unframe(v)
			if err != nil || int(gotID) != id {
				t.Fatalf("framing: id %d %v, want %d", gotID, err, id)
			}
			var raw map[string]any
			if err := avro.Unmarshal(plain, body, &raw); err != nil {
				t.Fatalf("decode without the logical types: %v", err)
			}
			for k, w := range c.want {
				if g := raw[k]; !sameValue(g, w) {
					t.Errorf("%s: %#v, want %#v", k, g, w)
				}
			}
			// hamba's own reading of the logical types.
			ss, err := reg.Client().SchemaByID(ctx, int(gotID))
			if err != nil {
				t.Fatal(err)
			}
			var typed map[string]any
			if err := avro.Unmarshal(avro.MustParse(ss.Schema), body, &typed); err != nil {
				t.Fatalf("decode with the logical types: %v", err)
			}
			if c.name == "strings" {
				if a, ok := typed["amount"].(*big.Rat); !ok || a.Cmp(big.NewRat(-12345, 10)) != 0 {
					t.Errorf("amount %#v, want -1234.5", typed["amount"])
				}
				if f, ok := typed["fee"].(*big.Rat); !ok || f.Cmp(big.NewRat(25, 2)) != 0 {
					t.Errorf("fee %#v, want 12.5", typed["fee"])
				}
				if d, ok := typed["day"].(time.Time); !ok || !d.Equal(time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC)) {
					t.Errorf("day %#v, want 2024-02-29", typed["day"])
				}
				if a, ok := typed["at_ms"].(time.Time); !ok || !a.Equal(at) {
					t.Errorf("at_ms %#v, want %s", typed["at_ms"], at)
				}
				if d, ok := typed["t_ms"].(time.Duration); !ok || d != 12*time.Hour+34*time.Minute+56*time.Second+789*time.Millisecond {
					t.Errorf("t_ms %#v, want 12:34:56.789", typed["t_ms"])
				}
				if d, ok := typed["span"].(avro.LogicalDuration); !ok || d.Months != 14 || d.Days != 3 || d.Milliseconds != 14706007 {
					t.Errorf("span %#v, want 14 months, 3 days, 14706007 ms", typed["span"])
				}
			}
		})
	}
}

// sameValue compares a decoded value with the wanted one: ints of any
// width by value, byte arrays and slices by content.
func sameValue(got, want any) bool {
	switch w := want.(type) {
	case int:
		return toInt64(got) == int64(w)
	case int64:
		return toInt64(got) == w
	case []byte:
		g, ok := got.([]byte)
		return ok && bytes.Equal(g, w)
	}
	return reflect.DeepEqual(got, want)
}

func toInt64(v any) int64 {
	switch n := v.(type) {
	case int:
		return int64(n)
	case int32:
		return int64(n)
	case int64:
		return n
	}
	return -1 << 63
}

// TestSchemaFirstAvroLogicalMismatches (no registry): a value that a
// logical type cannot hold exactly is a mismatch naming the field and
// why, never rounded or truncated.
func TestSchemaFirstAvroLogicalMismatches(t *testing.T) {
	t.Parallel()
	mismatch := func(field, reason string) *MismatchError {
		return &MismatchError{Subject: "s", Version: 1, Field: field, Reason: reason}
	}
	w, err := uncapped(compileAvro(paymentAvro, nil, mismatch))
	if err != nil {
		t.Fatal(err)
	}
	base := map[string]string{"amount": `"1"`, "fee": `"1"`, "id": `"0191d8a2-7c3e-7a51-8e2b-3f6c1d9e0a47"`, "day": `"2024-02-29"`,
		"at_ms": `0`, "at_us": `0`, "local_ms": `0`, "local_us": `0`, "t_ms": `0`, "t_us": `0`, "span": `"P1D"`}
	payload := func(field, value string) []byte {
		var parts []string
		for k, v := range base {
			if k == field {
				v = value
			}
			parts = append(parts, `"`+k+`": `+v)
		}
		return []byte("{" + strings.Join(parts, ", ") + "}")
	}
	if _, me := w(nil, payload("", "")); me != nil {
		t.Fatalf("the base payload: %v", me)
	}
	for _, c := range []struct{ field, value, reason string }{
		{"amount", `"1.234"`, "scale 2"},
		{"amount", `1.234`, "scale 2"},
		{"amount", `12345678.9`, "precision 9"},
		{"amount", `"abc"`, "not a decimal"},
		{"amount", `"NaN"`, "not a decimal"},
		{"amount", `"Infinity"`, "not a decimal"},
		{"amount", `true`, "want a decimal"},
		{"fee", `10000`, "precision 7"},
		{"fee", `"0.0001"`, "scale 3"},
		{"id", `"not-a-uuid"`, "uuid"},
		{"id", `"0191d8a2-7c3e-7a51-8e2b-3f6c1d9e0a4"`, "uuid"},
		{"day", `"2024-02-30"`, "date"},
		{"day", `"2024-02-29T00:00:00Z"`, "date"},
		{"day", `1.5`, "whole"},
		{"at_ms", `"2024-02-29T12:34:56"`, "offset"},
		{"at_ms", `"2024-02-29T12:34:56.7891Z"`, "millisecond"},
		{"at_ms", `1.5`, "whole"},
		{"at_us", `"2024-02-29T12:34:56.7891234Z"`, "microsecond"},
		{"local_ms", `"2024-02-29T12:34:56Z"`, "offset"},
		{"t_ms", `"24:00:00"`, "time"},
		{"t_ms", `86400000`, "range"},
		{"t_ms", `"12:00:00.0001"`, "millisecond"},
		{"t_us", `-1`, "range"},
		{"span", `"P1.5D"`, "duration"},
		{"span", `"PT-1S"`, "duration"},
		{"span", `"PT0.0001S"`, "millisecond"},
		{"span", `12`, "want"},
	} {
		_, me := w(nil, payload(c.field, c.value))
		if me == nil || me.Field != "/"+c.field || !strings.Contains(me.Reason, c.reason) {
			t.Errorf("%s %s: %v, want a mismatch at /%s saying %q", c.field, c.value, me, c.field, c.reason)
		}
	}
}

// Avro schemas that reference each other through the registry: an order
// names shop.Address, registered under its own subject, which names
// shop.Country, under another.
const (
	countryAvro = `{"type":"enum","name":"Country","namespace":"shop","symbols":["FR","DE"]}`
	addressAvro = `{"type":"record","name":"Address","namespace":"shop","fields":[{"name":"street","type":"string"},{"name":"country","type":"shop.Country"}]}`
	shipAvro    = `{"type":"record","name":"Shipment","namespace":"shop","fields":[{"name":"ship_to","type":"shop.Address"},{"name":"bill_to","type":["null","shop.Address"],"default":null}]}`
)

// TestRegistrySchemaFirstAvroReferences (a real Apicurio Registry): an
// Avro schema whose named types come from the registry's references
// (Confluent's API: name, subject, version), references of references
// included, is resolved and written; the record decodes with the three
// schemas parsed together.
func TestRegistrySchemaFirstAvroReferences(t *testing.T) {
	r := registrytest.Start(t)
	reg := mustRegistry(t, registry.Config{URL: r.URL()})
	cl := reg.Client()
	register(t, cl, "shop.Country", sr.Schema{Schema: countryAvro, Type: sr.TypeAvro})
	register(t, cl, "shop.Address", sr.Schema{Schema: addressAvro, Type: sr.TypeAvro,
		References: []sr.SchemaReference{{Name: "shop.Country", Subject: "shop.Country", Version: 1}}})
	id := register(t, cl, "Shipment", sr.Schema{Schema: shipAvro, Type: sr.TypeAvro,
		References: []sr.SchemaReference{{Name: "shop.Address", Subject: "shop.Address", Version: 1}}})
	enc := schemaFirst(t, r.URL(), Config{Kind: KindAvro})
	ctx := t.Context()
	v, err := enc.Value(ctx, "shipments", "Shipment", []byte(`{"ship_to": {"street": "1 rue A", "country": "FR"}, "bill_to": {"street": "2 Weg B", "country": "DE"}}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	gotID, body, _ := registry.Unframe(v)
	if int(gotID) != id {
		t.Fatalf("id %d, want %d", gotID, id)
	}
	cache := &avro.SchemaCache{}
	for _, s := range []string{countryAvro, addressAvro} {
		if _, err := avro.ParseWithCache(s, "", cache); err != nil {
			t.Fatal(err)
		}
	}
	schema, err := avro.ParseWithCache(shipAvro, "", cache)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := avro.Unmarshal(schema, body, &got); err != nil {
		t.Fatal(err)
	}
	if st := got["ship_to"].(map[string]any); st["street"] != "1 rue A" || st["country"] != "FR" {
		t.Errorf("ship_to %v", st)
	}
	if bt, ok := got["bill_to"].(map[string]any)["shop.Address"].(map[string]any); !ok || bt["country"] != "DE" {
		t.Errorf("bill_to %#v", got["bill_to"])
	}
	_, err = enc.Value(ctx, "shipments", "Shipment", []byte(`{"ship_to": {"street": "x", "country": "IT"}}`), 0)
	wantMismatch(t, "a symbol of the referenced enum", err, "/ship_to/country")

}

// TestSchemaFirstAvroLogicalDefaults (no registry): a missing field of a
// logical type takes its default as Avro's JSON encoding writes it (a
// decimal's default is its bytes, a date's a number of days), not read
// as the application's JSON would be.
func TestSchemaFirstAvroLogicalDefaults(t *testing.T) {
	t.Parallel()
	schema := `{"type":"record","name":"D","fields":[
	 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":4,"scale":2},"default":"\u0001\u0000"},
	 {"name":"day","type":{"type":"int","logicalType":"date"},"default":3},
	 {"name":"at","type":["null",{"type":"long","logicalType":"timestamp-millis"}],"default":null}]}`
	w, err := uncapped(compileAvro(schema, nil, func(field, reason string) *MismatchError { return &MismatchError{Field: field, Reason: reason} }))
	if err != nil {
		t.Fatal(err)
	}
	body, me := w(nil, []byte(`{}`))
	if me != nil {
		t.Fatal(me)
	}
	var raw map[string]any
	if err := avro.Unmarshal(avro.MustParse(logicalTypeProp.ReplaceAllString(strings.ReplaceAll(schema, "\n\t ", ""), "")), body, &raw); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw["amount"].([]byte), []byte{1, 0}) || raw["day"] != 3 || raw["at"] != nil {
		t.Errorf("defaults %#v, want amount 01 00 (2.56), day 3, at null", raw)
	}
}
