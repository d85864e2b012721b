package config

import (
	"strings"
	"testing"
)

// TestPassthroughSubjectStrategy: with kafka.value_format
// registry_passthrough, kafka.schema_registry.subject_strategy names the
// subject that a value's schema id must be a version of: <topic>-value by
// default, the event's type, <topic>-<type>, a configured subject, or
// any; a version, an unknown strategy, a subject without the strategy
// subject are refused at load, naming the keys.
func TestPassthroughSubjectStrategy(t *testing.T) {
	t.Parallel()
	base := "postgres:\n  dsn: postgres://u@h/db\nkafka:\n  brokers: [a:9092]\n  value_format: registry_passthrough\n  schema_registry:\n    url: http://r:8080/apis/ccompat/v7\n"
	for _, bad := range []struct{ yaml, want string }{
		{"    subject_strategy: record\n", `kafka.schema_registry.subject_strategy, subject with kafka.value_format registry_passthrough: subject strategy "record": want topic, type, topic_type, subject or any`},
		{"    subject_strategy: subject\n", `the subject strategy "subject" needs a subject`},
		{"    subject: orders-value\n", `a subject (orders-value) with the subject strategy "": want the strategy "subject"`},
		{"    subject_strategy: subject\n    subject: orders-value\n    version: \"2\"\n", "kafka.schema_registry.version 2 with kafka.value_format registry_passthrough"},
	} {
		if _, err := load(t, base+bad.yaml); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: err = %v, want %q", bad.yaml, err, bad.want)
		}
	}
	for _, good := range []struct{ yaml, want string }{
		{"", "orders-value"},
		{"    subject_strategy: topic\n", "orders-value"},
		{"    subject_strategy: type\n", "OrderCreated"},
		{"    subject_strategy: topic_type\n", "orders-OrderCreated"},
		{"    subject_strategy: subject\n    subject: shop-value\n", "shop-value"},
		{"    subject_strategy: any\n", ""},
	} {
		c, err := load(t, base+good.yaml)
		if err != nil {
			t.Fatalf("%q: %v", good.yaml, err)
		}
		sc, err := SinkConfig(c, nil)
		if err != nil {
			t.Fatalf("%q: %v", good.yaml, err)
		}
		if got, err := sc.Passthrough.Subject("orders", "OrderCreated"); err != nil || got != good.want {
			t.Errorf("%q: subject %q, %v, want %q", good.yaml, got, err, good.want)
		}
	}
}
