package config

import (
	"strings"
	"testing"
)

// TestDebeziumImportWorkerConverter: Kafka Connect configures each
// converter from one file, the connector's if it names the converter
// (key.converter, value.converter), else the worker's. A setting of that
// converter which walrelay does not map is refused by name whichever file
// it is in (before: one in the worker's file was ignored as "a Kafka
// Connect worker setting"); the other file's settings of a converter do
// not apply, and are noted so.
func TestDebeziumImportWorkerConverter(t *testing.T) {
	t.Parallel()
	// apicurio sets Apicurio's AvroConverter, mapped, on both sides of m.
	apicurio := func(m map[string]string) {
		for _, side := range []string{"key", "value"} {
			cv := side + ".converter"
			m[cv] = "io.apicurio.registry.utils.converter.AvroConverter"
			m[cv+".apicurio.registry.url"] = "http://registry:8080/apis/registry/v2"
			m[cv+".apicurio.registry.auto-register"] = "true"
			m[cv+".apicurio.registry.as-confluent"] = "true"
			m[cv+".apicurio.registry.use-id"] = "contentId"
			m[cv+".apicurio.registry.headers.enabled"] = "false"
		}
	}
	// connector is the connector without converters.
	connector := func() map[string]string {
		c, err := ReadDebezium([]byte(debeziumProps))
		if err != nil {
			t.Fatal(err)
		}
		for k := range c {
			if strings.HasPrefix(k, "key.converter") || strings.HasPrefix(k, "value.converter") {
				delete(c, k)
			}
		}
		return c
	}
	for _, c := range []struct{ option, value string }{
		{"value.converter.apicurio.registry.avro.encoding", "JSON"},
		{"value.converter.apicurio.registry.artifact-resolver-strategy", "io.apicurio.registry.serde.avro.strategy.RecordIdStrategy"},
		{"value.converter.apicurio.registry.dereference-schema", "true"},
		{"key.converter.apicurio.registry.avro.encoding", "JSON"},
	} {
		// In the worker, with the worker's converters; in the connector,
		// with the connector's.
		for _, inWorker := range []bool{true, false} {
			conn, worker := connector(), map[string]string{"bootstrap.servers": "k:9092"}
			if inWorker {
				apicurio(worker)
				worker[c.option] = c.value
			} else {
				apicurio(conn)
				conn[c.option] = c.value
			}
			_, _, err := FromDebezium(conn, worker)
			if want := c.option + ": an option walrelay does not know: it may change the records"; err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s=%s (in the worker: %v): %v, want %q", c.option, c.value, inWorker, err, want)
			}
			if err != nil && strings.Contains(err.Error(), c.value) {
				t.Errorf("%s: the value is quoted: %v", c.option, err)
			}
		}
	}

	// The header converter: Kafka Connect's default writes the
	// EventRouter's header fields as walrelay does; another is refused,
	// from either file.
	for _, c := range []struct {
		inWorker bool
		class    string
		refused  bool
	}{
		{true, "org.apache.kafka.connect.storage.SimpleHeaderConverter", false},
		{true, "org.apache.kafka.connect.json.JsonConverter", true},
		{false, "org.apache.kafka.connect.json.JsonConverter", true},
	} {
		conn, worker := connector(), map[string]string{"bootstrap.servers": "k:9092"}
		apicurio(worker)
		if c.inWorker {
			worker["header.converter"] = c.class
		} else {
			conn["header.converter"] = c.class
		}
		_, _, err := FromDebezium(conn, worker)
		if want := "header.converter: walrelay writes headers as the SimpleHeaderConverter"; c.refused != (err != nil) || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("header.converter %s (in the worker: %v): %v, want refused: %v (%q)", c.class, c.inWorker, err, c.refused, want)
		}
	}

	// The connector names its converters: the worker's settings of its
	// converters do not apply (a JsonConverter's, a registry's URL).
	conn, worker := connector(), map[string]string{"bootstrap.servers": "k:9092",
		"key.converter": "org.apache.kafka.connect.json.JsonConverter", "value.converter": "org.apache.kafka.connect.json.JsonConverter",
		"value.converter.schemas.enable": "false", "value.converter.apicurio.registry.url": "http://worker:8080/apis/registry/v2",
		"value.converter.apicurio.registry.avro.encoding": "JSON"}
	apicurio(conn)
	keys, ignored, err := FromDebezium(conn, worker)
	if err != nil || keys["kafka.value_format"] != "avro" || keys["kafka.schema_registry.url"] != "http://registry:8080/apis/ccompat/v7" {
		t.Fatalf("the connector's converters: %v, %v", keys, err)
	}
	noted := 0
	for _, n := range ignored {
		if strings.HasPrefix(n.Option, "value.converter.") && strings.Contains(n.Why, "the connector sets value.converter: Kafka Connect configures it from the connector's value.converter.* alone") {
			noted++
		}
	}
	if noted != 3 {
		t.Errorf("%d of the worker's 3 value.converter.* settings noted as not applied: %+v", noted, ignored)
	}

	// The worker names the converters: the connector's settings of them,
	// without the converter, do not apply either.
	conn, worker = connector(), map[string]string{"bootstrap.servers": "k:9092"}
	apicurio(worker)
	conn["value.converter.apicurio.registry.url"] = "http://connector:8080/apis/registry/v2"
	keys, ignored, err = FromDebezium(conn, worker)
	if err != nil || keys["kafka.schema_registry.url"] != "http://registry:8080/apis/ccompat/v7" {
		t.Fatalf("the worker's converters: %v, %v", keys, err)
	}
	noted = 0
	for _, n := range ignored {
		if n.Option == "value.converter.apicurio.registry.url" && strings.Contains(n.Why, "the connector does not set value.converter") {
			noted++
		}
	}
	if noted != 1 {
		t.Errorf("the connector's value.converter.apicurio.registry.url not noted as not applied: %+v", ignored)
	}
}
