package format

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/hamba/avro/v2"

	"github.com/walrelay/walrelay/format/registry"
)

// TestAvroSchema: an inferred Connect schema is translated as Apicurio's
// AvroData translates it and written as Avro's Java library writes it.
func TestAvroSchema(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"n": 1, "ok": true, "s": "x", "x": null, "e": [], "f": 1.5, "big": 4294967296}`,
			`["null",{"type":"record","name":"payload","fields":[{"name":"n","type":["null","int"],"default":null},{"name":"ok","type":["null","boolean"],"default":null},{"name":"s","type":["null","string"],"default":null},{"name":"f","type":["null","double"],"default":null},{"name":"big","type":["null","long"],"default":null}],"connect.name":"payload"}]`},
		// (merged items are a required record: a null among them fails
		// Debezium, TestAvroDebeziumParity)
		{`{"o": {"a": {"b": 1}}, "l": [{"p": 1}, {"q": "x"}]}`,
			`["null",{"type":"record","name":"payload","fields":[{"name":"o","type":["null",{"type":"record","name":"o","namespace":"payload","fields":[{"name":"a","type":["null",{"type":"record","name":"a","namespace":"payload.o","fields":[{"name":"b","type":["null","int"],"default":null}],"connect.name":"payload.o.a"}],"default":null}],"connect.name":"payload.o"}],"default":null},{"name":"l","type":["null",{"type":"array","items":{"type":"record","name":"l","namespace":"payload","fields":[{"name":"p","type":["null","int"],"default":null},{"name":"q","type":["null","string"],"default":null}],"connect.name":"payload.l"}}],"default":null}],"connect.name":"payload"}]`},
		{`[1, 2, 3]`, `["null",{"type":"array","items":["null","int"]}]`},
		{`[[{"a": 1}], [{"a": 2}]]`, `["null",{"type":"array","items":["null",{"type":"array","items":["null",{"type":"record","name":"ConnectDefault","namespace":"io.confluent.connect.avro","fields":[{"name":"a","type":["null","int"],"default":null}]}]}]}]`},
	} {
		// InferSchema, not Expand: a top-level array's schema too (which
		// ValueSchema refuses, as Debezium fails on it).
		n, err := ParseJSON([]byte(c.in))
		if err != nil {
			t.Fatal(err)
		}
		s, err := InferSchema("payload", n)
		if err != nil || s == nil {
			t.Fatalf("%s: not expanded: %v", c.in, err)
		}
		as, err := Avro(s)
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if as.Text != c.want {
			t.Errorf("%s:\n%s, want\n%s", c.in, as.Text, c.want)
		}
		b, err := as.EncodeAvro(s, n)
		if err != nil {
			t.Fatalf("%s: encode: %v", c.in, err)
		}
		roundTrip(t, as.Text, b, c.in)
	}
	for s, want := range map[*ConnectSchema]string{
		KeySchema:      `"string"`,
		JSONTextSchema: `["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]`,
		TextSchema:     `["null","string"]`,
		BytesSchema:    `["null","bytes"]`,
	} {
		as, err := Avro(s)
		if err != nil || as.Text != want {
			t.Errorf("%+v: %s (%v), want %s", s, as.Text, err, want)
		}
	}
}

// TestValueSchema: the schema of a value as the converter registers it:
// an expanded object's record itself (the datum's schema), a string's or
// an array's optional union; a NOT NULL column's string no union.
func TestValueSchema(t *testing.T) {
	for _, c := range []struct {
		p    Payload
		want string
	}{
		{Payload{Text: []byte(`{"a": 1}`), Column: "payload", Expand: true}, `{"type":"record","name":"payload","fields":[{"name":"a","type":["null","int"],"default":null}],"connect.name":"payload"}`},
		{Payload{Text: []byte(`[1]`), Column: "payload", Expand: true}, ""}, // Debezium fails on a top-level array
		{Payload{Text: []byte(`{"a": 1}`), Column: "payload"}, `["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]`},
		{Payload{Text: []byte(`x`), Column: "payload", Required: true}, `{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}`},
		{Payload{Text: []byte(`x`), Column: "payload", TextColumn: true, Required: true}, `"string"`},
		{Payload{Text: []byte(`x`), Column: "payload", Bytes: true}, `["null","bytes"]`},
		{Payload{Text: []byte(`{"a": 1}`), Column: "payload", TextColumn: true, Expand: true}, `{"type":"record","name":"payload","fields":[{"name":"a","type":["null","int"],"default":null}],"connect.name":"payload"}`},
		{Payload{Text: []byte(`{"a": 1}`), Column: "payload", Bytes: true, Expand: true}, `["null","bytes"]`},
	} {
		s, _, err := ValueSchema(c.p)
		if c.want == "" {
			if !errors.Is(err, registry.ErrPayload) {
				t.Errorf("%s %+v: %v, want ErrPayload", c.p.Text, c.p, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s %+v: %v", c.p.Text, c.p, err)
		}
		as, err := Avro(s)
		if err != nil || as.Text != c.want {
			t.Errorf("%s %+v: %s (%v), want %s", c.p.Text, c.p, as.Text, err, c.want)
		}
	}
}

// roundTrip decodes b with the schema text and compares it with the JSON
// it was encoded from (nulls and empty arrays, which the schema leaves
// out, aside).
func roundTrip(t *testing.T, schema string, b []byte, in string) {
	t.Helper()
	var got any
	if err := avro.Unmarshal(avro.MustParse(schema), b, &got); err != nil {
		t.Fatalf("%s: decode: %v", in, err)
	}
	var want any
	d := json.NewDecoder(bytes.NewReader([]byte(in)))
	d.UseNumber()
	if err := d.Decode(&want); err != nil {
		t.Fatal(err)
	}
	if g, w := plain(got), prune(want); !reflect.DeepEqual(g, w) {
		t.Errorf("%s: decoded %#v, want %#v", in, g, w)
	}
	dec, err := DecodeAvro(schema, b)
	if err != nil {
		t.Fatalf("%s: DecodeAvro: %v", in, err)
	}
	if g, w := plain(dec), prune(want); !reflect.DeepEqual(g, w) {
		t.Errorf("%s: DecodeAvro %#v, want %#v", in, g, w)
	}
}

// plain is a decoded Avro value with its union wrappers ({"type": v})
// taken off and its numbers as JSON numbers' text, and nulls dropped.
func plain(v any) any {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 1 {
			for k, u := range x {
				if k == "int" || k == "long" || k == "double" || k == "string" || k == "boolean" || k == "array" || k == "bytes" || k == "payload" || bytes.ContainsRune([]byte(k), '.') {
					return plain(u)
				}
			}
		}
		out := map[string]any{}
		for k, u := range x {
			if u != nil {
				out[k] = plain(u)
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, u := range x {
			out[i] = plain(u)
		}
		return out
	case int:
		return json.Number(itoa(int64(x)))
	case int32:
		return json.Number(itoa(int64(x)))
	case int64:
		return json.Number(itoa(x))
	case float64:
		b, _ := json.Marshal(x)
		return json.Number(b)
	}
	return v
}

func itoa(v int64) string { b, _ := json.Marshal(v); return string(b) }

// prune drops a JSON value's nulls and empty arrays from objects, and
// writes its numbers as Go writes them.
func prune(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, u := range x {
			if a, ok := u.([]any); u == nil || ok && len(a) == 0 {
				continue
			}
			out[k] = prune(u)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, u := range x {
			out[i] = prune(u)
		}
		return out
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return json.Number(itoa(i))
		}
		f, _ := x.Float64()
		b, _ := json.Marshal(f)
		return json.Number(b)
	}
	return v
}

// TestAvroRefuses: what Debezium's converter fails on is refused, with
// ErrAvroName or a reason naming the field.
func TestAvroRefuses(t *testing.T) {
	for in, want := range map[string]string{
		`{"first-name": "a"}`:           "not a valid Avro name",
		`{"1st": "a"}`:                  "not a valid Avro name",
		`{"o": {"a b": 1}}`:             "not a valid Avro name",
		`{"n": 123456789012345678901}`:  "beyond 64 bits",
		`{"l": [{"p": 1}, {"p": "x"}]}`: "l[1].p: a JSON string in a field of type int32",
	} {
		s, n := Expand([]byte(in), "payload", true)
		as, err := Avro(s)
		if err == nil {
			_, err = as.EncodeAvro(s, n)
		}
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Errorf("%s: %v, want an error with %q", in, err, want)
		}
		if want == "not a valid Avro name" && !errors.Is(err, ErrAvroName) {
			t.Errorf("%s: %v is no ErrAvroName", in, err)
		}
	}
}

// TestAvroArraysAsJava: an array is one block, its count without a byte
// size, as Avro's Java library writes it (the block size that hamba/avro
// writes by default is valid Avro, but not Debezium's bytes).
func TestAvroArraysAsJava(t *testing.T) {
	s, n := Expand([]byte(`{"l": [1, 2]}`), "payload", true)
	as, err := Avro(s)
	if err != nil {
		t.Fatal(err)
	}
	b, err := as.EncodeAvro(s, n)
	// union branch 1 (record), field l: union branch 1 (array), count 2,
	// branch 1 int 1, branch 1 int 2, end of the array.
	if want := []byte{0x02, 0x02, 0x04, 0x02, 0x02, 0x02, 0x04, 0x00}; err != nil || !bytes.Equal(b, want) {
		t.Fatalf("%x %v, want %x", b, err, want)
	}
}
