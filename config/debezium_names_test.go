package config

import (
	"strings"
	"testing"
)

// TestDebeziumImportRefusesNamesThatWouldRunAsSQL: a connector whose table
// or column names could end the SQL walrelay migrate writes them into (a
// '$' that closes a dollar-quoted body, a control character) or that
// PostgreSQL would cut is refused, each option named, and no YAML is
// given. Before, the import copied them into the YAML, and walrelay
// migrate ran what followed the $$ as SQL.
func TestDebeziumImportRefusesNamesThatWouldRunAsSQL(t *testing.T) {
	t.Parallel()
	const hostile = "payload$$; ALTER ROLE app SUPERUSER; SELECT $$"
	for option, value := range map[string]string{
		"transforms.outbox.table.field.event.payload":         hostile,
		"transforms.outbox.table.field.event.id":              "id\n",
		"transforms.outbox.route.by.field":                    strings.Repeat("a", 64),
		"transforms.outbox.table.fields.additional.placement": hostile + ":header:h",
		"transforms.outbox.tracing.span.context.field":        "trace$x",
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
}

// TestNamesThatWouldRunAsSQLAreRefusedAtLoad: a configured table or column
// name that could end the SQL walrelay writes it into, or that PostgreSQL
// would cut, is refused when the configuration loads, naming the setting
// and the rule, for the top-level keys and outbox.tables alike.
func TestNamesThatWouldRunAsSQLAreRefusedAtLoad(t *testing.T) {
	base := "postgres:\n  dsn: postgres://u@h/db\nkafka:\n  brokers: [a:9092]\n"
	for _, bad := range []struct{ yaml, want string }{
		{"outbox:\n  payload_column: 'payload$$; ALTER ROLE app SUPERUSER; SELECT $$'\n", `payload column: name "payload$$; ALTER ROLE app SUPERUSER; SELECT $$" holds a '$'`},
		{"outbox:\n  header_columns: [\"a\\nb\"]\n", `header column: name "a\nb" holds the control character U+000A`},
		{"postgres:\n  table: public." + strings.Repeat("t", 64) + "\n", "PostgreSQL keeps the first 63 bytes of a name"},
		{"outbox:\n  trace_column: x$y\n", `trace column: name "x$y" holds a '$'`},
		{"outbox:\n  tables:\n    - table: public.a\n    - table: public.b\n      id_column: i$d\n", `outbox table "public.b": id column: name "i$d" holds a '$'`},
	} {
		yaml := base + bad.yaml
		if strings.HasPrefix(bad.yaml, "postgres:") {
			yaml = "postgres:\n  dsn: postgres://u@h/db\n" + strings.TrimPrefix(bad.yaml, "postgres:\n") + "kafka:\n  brokers: [a:9092]\n"
		}
		if _, err := load(t, yaml); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: err = %v, want %q", bad.yaml, err, bad.want)
		}
	}
}
