package format

import (
	"encoding/hex"
	"errors"
	"testing"

	"github.com/walrelay/walrelay/format/registry"
)

// TestAvroKeyByColumnType: the key's schema and bytes follow the aggregate
// id column's type and nullability, as Debezium 3.6.1's EventRouter
// (defineRecordKeySchema) and Apicurio's AvroData write them: the schema
// texts and bytes are what testdata/debezium_key_Probe.java.txt printed
// (AvroData and GenericDatumWriter from Debezium 3.6.1's classpath) for
// the Connect schemas of these columns.
func TestAvroKeyByColumnType(t *testing.T) {
	const uuid = "0b7e9a8c-1f2d-4e5a-9b6c-7d8e9f0a1b2c"
	uuidHex := hex.EncodeToString([]byte(uuid))
	for _, c := range []struct {
		name   string
		col    KeyColumn
		key    string
		schema string
		bytes  string
	}{
		{"no column (a logical message)", KeyColumn{}, "order-7", `"string"`, "0e6f726465722d37"},
		{"text not null", KeyColumn{Type: OIDText}, "order-7", `"string"`, "0e6f726465722d37"},
		{"varchar not null", KeyColumn{Type: OIDVarchar}, "order-7", `"string"`, "0e6f726465722d37"},
		{"char not null", KeyColumn{Type: OIDBpchar}, "ab ", `"string"`, "06616220"},
		{"text nullable", KeyColumn{Type: OIDText, Nullable: true}, "order-7", `["null","string"]`, "020e6f726465722d37"},
		{"varchar nullable", KeyColumn{Type: OIDVarchar, Nullable: true}, "order-7", `["null","string"]`, "020e6f726465722d37"},
		{"uuid not null", KeyColumn{Type: OIDUUID}, uuid, `{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Uuid"}`, "48" + uuidHex},
		{"uuid nullable", KeyColumn{Type: OIDUUID, Nullable: true}, uuid, `["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Uuid"}]`, "0248" + uuidHex},
		{"smallint", KeyColumn{Type: OIDInt2}, "-32768", `{"type":"int","connect.type":"int16"}`, "ffff03"},
		{"smallint nullable", KeyColumn{Type: OIDInt2, Nullable: true}, "7", `["null",{"type":"int","connect.type":"int16"}]`, "020e"},
		{"integer", KeyColumn{Type: OIDInt4}, "42", `"int"`, "54"},
		{"integer negative", KeyColumn{Type: OIDInt4}, "-1", `"int"`, "01"},
		{"integer nullable", KeyColumn{Type: OIDInt4, Nullable: true}, "42", `["null","int"]`, "0254"},
		{"bigint", KeyColumn{Type: OIDInt8}, "4294967296", `"long"`, "8080808020"},
		{"bigint small", KeyColumn{Type: OIDInt8}, "42", `"long"`, "54"},
		{"bigint max", KeyColumn{Type: OIDInt8}, "9223372036854775807", `"long"`, "feffffffffffffffff01"},
		{"bigint nullable", KeyColumn{Type: OIDInt8, Nullable: true}, "42", `["null","long"]`, "0254"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := KeySchemaOf(c.col)
			if err != nil {
				t.Fatal(err)
			}
			as, err := Avro(s)
			if err != nil {
				t.Fatal(err)
			}
			if as.Text != c.schema {
				t.Errorf("schema %s, want %s", as.Text, c.schema)
			}
			n, err := KeyNode(s, []byte(c.key))
			if err != nil {
				t.Fatal(err)
			}
			b, err := as.EncodeAvro(s, n)
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(b); got != c.bytes {
				t.Errorf("bytes %s, want %s", got, c.bytes)
			}
		})
	}
}

// TestAvroKeyRefused: a column type walrelay does not map (numeric) is
// ErrKeyType; an integer key that is not a number (it cannot come from an
// integer column) is ErrPayload.
func TestAvroKeyRefused(t *testing.T) {
	if _, err := KeySchemaOf(KeyColumn{Type: 1700}); !errors.Is(err, ErrKeyType) {
		t.Errorf("numeric: %v, want ErrKeyType", err)
	}
	s, _ := KeySchemaOf(KeyColumn{Type: OIDInt4})
	if _, err := KeyNode(s, []byte("x")); !errors.Is(err, registry.ErrPayload) {
		t.Errorf("integer key x: %v, want ErrPayload", err)
	}
	s, _ = KeySchemaOf(KeyColumn{Type: OIDInt2})
	as, err := Avro(s)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := KeyNode(s, []byte("40000"))
	if _, err := as.EncodeAvro(s, n); err == nil {
		t.Error("smallint 40000: written")
	}
}
