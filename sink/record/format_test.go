package record

import (
	"errors"
	"testing"

	"github.com/walrelay/walrelay/format"
)

func TestJSONOfBytes(t *testing.T) {
	if got := string(FormatJSON.encodeBytes([]byte{0xff, 0x00, 'a'}, bytesSchema)); got != `"/wBh"` {
		t.Fatalf("json of bytes: %s", got)
	}
	if got := string(FormatJSON.encodeBytes(nil, bytesSchema)); got != "null" {
		t.Fatalf("json of NULL bytes: %s", got)
	}
}

// TestJSONFormats: the JsonConverter's forms of a key and a payload, as
// Debezium 3.6.1 wrote them here (TestDebeziumParity compares them with a
// running Debezium): Jackson's escaping, a character outside the BMP as a
// surrogate pair, NULL as JSON null.
func TestJSONFormats(t *testing.T) {
	t.Parallel()
	payload := []byte("{\"t\": \"q \\\" / é 😀 \u2028 <>&\"}\x01")
	for _, c := range []struct {
		f      Format
		in     []byte
		schema string
		want   string
	}{
		{FormatRaw, payload, "", string(payload)},
		{FormatRaw, nil, "", ""},
		{FormatJSON, []byte("o-1"), keySchema, `"o-1"`},
		{FormatJSON, payload, jsonSchema, `"{\"t\": \"q \\\" / é \uD83D\uDE00 ` + "\u2028" + ` <>&\"}\u0001"`},
		{FormatJSON, nil, jsonSchema, `null`},
		{FormatJSONSchema, []byte("o-1"), keySchema, `{"schema":{"type":"string","optional":false},"payload":"o-1"}`},
		{FormatJSONSchema, nil, jsonSchema, `{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":null}`},
	} {
		if got := string(c.f.encode(c.in, c.schema)); got != c.want {
			t.Fatalf("%s of %q: %s, want %s", c.f, c.in, got, c.want)
		}
	}
	if f, err := ParseFormat("avro"); err != nil || f != FormatAvro {
		t.Fatalf("avro: %q, %v", f, err)
	}
	if _, err := ParseFormat("protobuf"); err == nil {
		t.Fatal("protobuf accepted")
	}
}

// TestJSONKeyByColumnType: the json and json_schema keys follow the
// aggregate id column's Connect schema, as Debezium's EventRouter gives it
// to the JsonConverter: an integer column's key a JSON number of schema
// int16, int32 or int64, a uuid column's io.debezium.data.Uuid, a nullable
// column's optional (as the JsonConverter of Debezium 3.6.1's classpath
// wrote them: format/testdata/debezium_key_Probe.java.txt); a type
// without a known schema (numeric) stays a required string, as before.
func TestJSONKeyByColumnType(t *testing.T) {
	t.Parallel()
	const u = "0b7e9a8c-1f2d-4e5a-9b6c-7d8e9f0a1b2c"
	for _, c := range []struct {
		col  format.KeyColumn
		key  string
		json string
		sch  string
	}{
		{format.KeyColumn{}, "o-1", `"o-1"`, `{"schema":{"type":"string","optional":false},"payload":"o-1"}`},
		{format.KeyColumn{Type: format.OIDVarchar}, "o-1", `"o-1"`, `{"schema":{"type":"string","optional":false},"payload":"o-1"}`},
		{format.KeyColumn{Type: format.OIDText, Nullable: true}, "o-1", `"o-1"`, `{"schema":{"type":"string","optional":true},"payload":"o-1"}`},
		{format.KeyColumn{Type: format.OIDUUID}, u, `"` + u + `"`, `{"schema":{"type":"string","optional":false,"name":"io.debezium.data.Uuid","version":1},"payload":"` + u + `"}`},
		{format.KeyColumn{Type: format.OIDUUID, Nullable: true}, u, `"` + u + `"`, `{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Uuid","version":1},"payload":"` + u + `"}`},
		{format.KeyColumn{Type: format.OIDInt2}, "-7", `-7`, `{"schema":{"type":"int16","optional":false},"payload":-7}`},
		{format.KeyColumn{Type: format.OIDInt4}, "42", `42`, `{"schema":{"type":"int32","optional":false},"payload":42}`},
		{format.KeyColumn{Type: format.OIDInt8}, "4294967296", `4294967296`, `{"schema":{"type":"int64","optional":false},"payload":4294967296}`},
		{format.KeyColumn{Type: format.OIDInt8, Nullable: true}, "42", `42`, `{"schema":{"type":"int64","optional":true},"payload":42}`},
		{format.KeyColumn{Type: 1700}, "4.2", `"4.2"`, `{"schema":{"type":"string","optional":false},"payload":"4.2"}`},
	} {
		if got := string(FormatJSON.encodeKey([]byte(c.key), c.col)); got != c.json {
			t.Errorf("json key %q of %+v: %s, want %s", c.key, c.col, got, c.json)
		}
		if got := string(FormatJSONSchema.encodeKey([]byte(c.key), c.col)); got != c.sch {
			t.Errorf("json_schema key %q of %+v: %s, want %s", c.key, c.col, got, c.sch)
		}
	}
	if err := CheckKeyColumn(FormatAvro, format.KeyColumn{Type: 1700}); !errors.Is(err, format.ErrKeyType) {
		t.Errorf("avro key of a numeric column: %v, want ErrKeyType", err)
	}
	if err := CheckKeyColumn(FormatJSON, format.KeyColumn{Type: 1700}); err != nil {
		t.Errorf("json key of a numeric column: %v", err)
	}
}
