package config

import (
	"strings"
	"testing"
)

// TestDebeziumImportBinaryPayload: Debezium's Avro recipe (a bytea payload
// that the application framed, value.converter BinaryDataConverter or
// ByteArrayConverter) imports as the raw value format, which publishes
// the bytes as they are, with a note naming registry_passthrough; the same
// converter on the key is refused by name.
func TestDebeziumImportBinaryPayload(t *testing.T) {
	worker, _ := ReadDebezium([]byte("bootstrap.servers=k1:9092\n"))
	for _, conv := range []string{binaryConverter, byteArrayConverter} {
		props, err := ReadDebezium([]byte(debeziumProps))
		if err != nil {
			t.Fatal(err)
		}
		props["value.converter"] = conv
		props["value.converter.delegate.converter.type"] = jsonConverter
		keys, ignored, err := FromDebezium(props, worker)
		if err != nil {
			t.Fatalf("%s: %v", conv, err)
		}
		if f := keys["kafka.value_format"]; f != "" && f != "raw" {
			t.Errorf("%s: kafka.value_format %q, want raw", conv, f)
		}
		noted := false
		for _, n := range ignored {
			noted = noted || (n.Option == "value.converter" && strings.Contains(n.Why, "registry_passthrough"))
		}
		if !noted {
			t.Errorf("%s: no note naming registry_passthrough: %v", conv, ignored)
		}
		props["key.converter"] = conv
		if _, _, err := FromDebezium(props, worker); err == nil || !strings.Contains(err.Error(), "key.converter") {
			t.Errorf("%s on the key: %v, want refused", conv, err)
		}
	}
}
