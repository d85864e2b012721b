package config

import (
	"strings"
	"testing"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/sink/record"
)

// TestSchemaFirstKeys: kafka.value_format registered_avro,
// registered_protobuf and registered_jsonschema give the sink a
// schema-first encoder with the subject strategy of
// kafka.schema_registry.*; what cannot work is refused at load, naming the
// key.
func TestSchemaFirstKeys(t *testing.T) {
	t.Parallel()
	base := "postgres:\n  dsn: postgres://u@h/db\nkafka:\n  brokers: [a:9092]\n"
	reg := "  schema_registry:\n    url: http://r:8080/apis/ccompat/v7\n"
	for _, bad := range []struct{ yaml, want string }{
		{"  value_format: registered_avro\n", "kafka.value_format registered_avro needs kafka.schema_registry.url"},
		{"  key_format: registered_protobuf\n" + reg, "kafka.key_format registered_protobuf: the schema-first formats are for values"},
		{"  value_format: registered_avro\n" + reg + "    message: shop.Order\n", "kafka.schema_registry.message \"shop.Order\" is for kafka.value_format registered_protobuf"},
		{"  value_format: registered_avro\n" + reg + "    subject_strategy: record\n", `subject strategy "record": want type, topic_type or subject`},
		{"  value_format: registered_avro\n" + reg + "    subject_strategy: subject\n", `the subject strategy "subject" needs a subject`},
		{"  value_format: registered_avro\n" + reg + "    version: \"2\"\n", "version 2 with the subject strategy \"type\""},
		{"  value_format: registered_avro\n" + reg + "    subject_strategy: subject\n    subject: s\n    version: first\n", `kafka.schema_registry.version: version "first"`},
		{"  value_format: registered_jsonschema\n  expand_json_payload: true\n" + reg, "kafka.expand_json_payload with kafka.value_format registered_jsonschema"},
	} {
		if _, err := load(t, base+bad.yaml); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: err = %v, want %q", bad.yaml, err, bad.want)
		}
	}
	for _, good := range []struct {
		yaml     string
		format   record.Format
		subjects []string
	}{
		{"  value_format: registered_avro\n" + reg + "    subjects: [OrderCreated, OrderPaid]\n", record.FormatRegisteredAvro, []string{"OrderCreated", "OrderPaid"}},
		{"  value_format: registered_protobuf\n" + reg + "    subject_strategy: subject\n    subject: orders-value\n    version: \"3\"\n    message: shop.Order\n", record.FormatRegisteredProtobuf, []string{"orders-value"}},
		{"  value_format: registered_jsonschema\n" + reg + "    subject_strategy: topic_type\n", record.FormatRegisteredJSONSchema, nil},
	} {
		c, err := load(t, base+good.yaml)
		if err != nil {
			t.Fatalf("%q: %v", good.yaml, err)
		}
		sc, err := SinkConfig(c, nil)
		if err != nil {
			t.Fatalf("%q: %v", good.yaml, err)
		}
		if sc.ValueFormat != good.format || sc.SchemaFirst == nil {
			t.Errorf("%q: value format %s, encoder %v", good.yaml, sc.ValueFormat, sc.SchemaFirst)
		}
		if got := c.SchemaFirstSubjects(); strings.Join(got, ",") != strings.Join(good.subjects, ",") {
			t.Errorf("%q: check's subjects %v, want %v", good.yaml, got, good.subjects)
		}
	}
	c, err := load(t, base+"  value_format: registered_protobuf\n"+reg+"    subject_strategy: topic_type\n")
	if err != nil {
		t.Fatal(err)
	}
	sf, _ := SchemaFirst(c)
	if subject, err := sf.Subject("orders", "OrderCreated"); err != nil || subject != "orders-OrderCreated" {
		t.Errorf("topic_type subject %q %v", subject, err)
	}
	if strategy, _ := sf.Strategy(); strategy != registry.StrategyTopicType {
		t.Errorf("strategy %s", strategy)
	}
}

// TestSchemaFirstSchemaFiles: an entry of kafka.schema_registry.subjects
// may name the file of its schema (subject=path), which walrelay
// registers at start with kafka.schema_registry.auto_register; check's
// subjects are the names alone; an entry without a subject or a path, a
// subject given twice, or a file with a format that is not schema-first,
// is refused at load.
func TestSchemaFirstSchemaFiles(t *testing.T) {
	t.Parallel()
	base := "postgres:\n  dsn: postgres://u@h/db\nkafka:\n  brokers: [a:9092]\n"
	reg := "  schema_registry:\n    url: http://r:8080/apis/ccompat/v7\n    auto_register: true\n"
	c, err := load(t, base+"  value_format: registered_avro\n"+reg+"    subjects: [OrderCreated=schemas/order-created.avsc, OrderPaid]\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.SchemaFirstSubjects(); strings.Join(got, ",") != "OrderCreated,OrderPaid" {
		t.Errorf("check's subjects %v", got)
	}
	if got := c.SchemaFiles(); len(got) != 1 || got[0] != (SchemaFile{Subject: "OrderCreated", Path: "schemas/order-created.avsc"}) {
		t.Errorf("schema files %v", got)
	}
	c, err = load(t, base+"  value_format: registered_protobuf\n"+reg+"    subject_strategy: subject\n    subject: orders-value\n    subjects: [orders-value=o.proto]\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.SchemaFiles(); len(got) != 1 || got[0].Subject != "orders-value" || strings.Join(c.SchemaFirstSubjects(), ",") != "orders-value" {
		t.Errorf("the subject strategy's subject with its file: %v", got)
	}
	for _, bad := range []struct{ yaml, want string }{
		{"  value_format: registered_avro\n" + reg + "    subjects: [\"=a.avsc\"]\n", "kafka.schema_registry.subjects: \"=a.avsc\""},
		{"  value_format: registered_avro\n" + reg + "    subjects: [A=]\n", "kafka.schema_registry.subjects: \"A=\""},
		{"  value_format: registered_avro\n" + reg + "    subjects: [A=a.avsc, A=b.avsc]\n", "kafka.schema_registry.subjects: A is given twice"},
		{"  value_format: avro\n" + reg + "    subjects: [A=a.avsc]\n", "kafka.schema_registry.subjects: schema files (A=a.avsc) are for the schema-first formats"},
	} {
		if _, err := load(t, base+bad.yaml); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: err = %v, want %q", bad.yaml, err, bad.want)
		}
	}
}
