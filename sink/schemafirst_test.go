package sink

import (
	"strings"
	"testing"

	"github.com/walrelay/walrelay/format/schemafirst"
	"github.com/walrelay/walrelay/sink/record"
)

// TestSchemaFirstFormats: the schema-first formats parse, name their kind
// of schema, need an encoder, and are for values only.
func TestSchemaFirstFormats(t *testing.T) {
	t.Parallel()
	for name, kind := range map[string]string{"registered_avro": schemafirst.KindAvro, "registered_protobuf": schemafirst.KindProtobuf, "registered_jsonschema": schemafirst.KindJSONSchema} {
		f, err := record.ParseFormat(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if k, ok := f.SchemaFirst(); !ok || k != kind || !f.Registry() {
			t.Errorf("%s: kind %q %v", name, k, ok)
		}
		if _, err := New(Config{Brokers: []string{"127.0.0.1:1"}, ValueFormat: f}); err == nil || !strings.Contains(err.Error(), "no schema registry configured") {
			t.Errorf("%s without an encoder: %v", name, err)
		}
		if _, err := New(Config{Brokers: []string{"127.0.0.1:1"}, KeyFormat: f}); err == nil || !strings.Contains(err.Error(), "for values") {
			t.Errorf("%s as the key: %v", name, err)
		}
	}
	for _, f := range []record.Format{record.FormatRaw, record.FormatJSON, record.FormatJSONSchema, record.FormatAvro} {
		if _, ok := f.SchemaFirst(); ok {
			t.Errorf("%s is schema-first", f)
		}
	}
}
