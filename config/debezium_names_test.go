package config

import (
	"strings"
	"testing"
)

// TestDebeziumImportRefusesNamesThatWouldRunAsSQL: a connector whose table
// or column names hold a control character or that PostgreSQL would cut
// is refused, each option named, and no YAML is given; a name with a $$
// (which walrelay migrate quotes under a tag it does not hold) is imported
// as it is. Before, the import copied every name into the YAML.
func TestDebeziumImportRefusesNamesThatWouldRunAsSQL(t *testing.T) {
	t.Parallel()
	const hostile = "payload$$; ALTER ROLE app SUPERUSER; SELECT $$"
	for option, value := range map[string]string{
		"transforms.outbox.table.field.event.payload":         "payload\x1b[2J",
		"transforms.outbox.table.field.event.id":              "id\n",
		"transforms.outbox.route.by.field":                    strings.Repeat("a", 64),
		"transforms.outbox.table.fields.additional.placement": "h\x7f:header:h",
		"transforms.outbox.tracing.span.context.field":        "trace\u202ex",
		"table.include.list":                                  "public.out\x01box",
	} {
		props, _ := ReadDebezium([]byte(debeziumProps))
		props[option] = value
		keys, _, err := FromDebezium(props, nil)
		if err == nil {
			t.Errorf("%s=%q: imported as %v", option, value, keys)
			continue
		}
		if !strings.Contains(err.Error(), option+": walrelay writes this name into SQL and refuses it") {
			t.Errorf("%s=%q: %v, want the option refused for its name", option, value, err)
		}
	}
	props, _ := ReadDebezium([]byte(debeziumProps))
	props["transforms.outbox.table.field.event.payload"] = hostile
	if keys, _, err := FromDebezium(props, nil); err != nil || keys["outbox.payload_column"] != hostile {
		t.Errorf("a payload column with $$: %v, %q; want it imported as it is", err, keys["outbox.payload_column"])
	}
}

// TestNamesThatWouldRunAsSQLAreRefusedAtLoad: a configured table or column
// name with a control character (a terminal escape, a bidirectional
// override, a tab), or that PostgreSQL would cut, is refused when the
// configuration loads, naming the setting and the rule, for the top-level
// keys and outbox.tables alike; a name with a $ is taken.
func TestNamesThatWouldRunAsSQLAreRefusedAtLoad(t *testing.T) {
	base := "postgres:\n  dsn: postgres://u@h/db\nkafka:\n  brokers: [a:9092]\n"
	for _, bad := range []struct{ yaml, want string }{
		{"outbox:\n  payload_column: \"payload\\e[2J\"\n", `payload column: name "payload\x1b[2J" holds the control character U+001B`},
		{"outbox:\n  header_columns: [\"a\\nb\"]\n", `header column: name "a\nb" holds the control character U+000A`},
		{"postgres:\n  table: public." + strings.Repeat("t", 64) + "\n", "PostgreSQL keeps the first 63 bytes of a name"},
		{"outbox:\n  trace_column: \"x\\u202Ey\"\n", `trace column: name "x\u202ey" holds the control character U+202E`},
		{"outbox:\n  tables:\n    - table: public.a\n    - table: public.b\n      id_column: \"i\\td\"\n", `outbox table "public.b": id column: name "i\td" holds the control character U+0009`},
	} {
		yaml := base + bad.yaml
		if strings.HasPrefix(bad.yaml, "postgres:") {
			yaml = "postgres:\n  dsn: postgres://u@h/db\n" + strings.TrimPrefix(bad.yaml, "postgres:\n") + "kafka:\n  brokers: [a:9092]\n"
		}
		if _, err := load(t, yaml); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: err = %v, want %q", bad.yaml, err, bad.want)
		}
	}
	if _, err := load(t, base+"outbox:\n  payload_column: 'payload$$; SELECT $$'\n"); err != nil {
		t.Errorf("a payload column with $$: %v, want it taken", err)
	}
}

// TestTraceHeaderColumnsRefusedWithTracing: with tracing.enabled, a header
// column that gives the traceparent or tracestate header (which walrelay's
// spans read as the trace context, unchecked) is refused, pointing to
// outbox.trace_column, whose text is checked to W3C's shape; without
// tracing it is a header like any other.
func TestTraceHeaderColumnsRefusedWithTracing(t *testing.T) {
	base := "postgres:\n  dsn: postgres://u@h/db\nkafka:\n  brokers: [a:9092]\n"
	for _, cols := range []string{"[traceparent]", "[tp:TraceState]"} {
		yaml := base + "outbox:\n  header_columns: " + cols + "\n"
		if _, err := load(t, yaml); err != nil {
			t.Errorf("header columns %s without tracing: %v", cols, err)
		}
		if _, err := load(t, yaml+"tracing:\n  enabled: true\n"); err == nil || !strings.Contains(err.Error(), "name the column in outbox.trace_column instead") {
			t.Errorf("header columns %s with tracing.enabled: %v, want it refused", cols, err)
		}
	}
}
