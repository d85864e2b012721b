package config

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// load loads the YAML text as --config with the variables env (name,
// value pairs) set.
func load(t *testing.T, yaml string, env ...string) (*Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "walrelay.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(env); i += 2 {
		t.Setenv(env[i], env[i+1])
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	cs := NewSet(fs)
	if err := fs.Parse([]string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	return cs.Load(fs, true)
}

// TestOutboxTables: outbox.tables from the file (a list of mappings) or the
// environment (its JSON); an entry's empty keys take the top-level keys,
// header_columns: [] takes none; an entry with a topic routes by it; one
// table or the named one is what a recovery command works on; mistakes are
// refused with the entry named.
func TestOutboxTables(t *testing.T) {
	const base = `
postgres:
  dsn: postgres://u@h/app
kafka:
  brokers: [b:9092]
  cloudevents: binary
outbox:
  header_columns: [tenant]
  timestamp_column: created_at
`
	cfg, err := load(t, base+`
  tables:
    - table: outbox
    - table: billing.events
      id_column: event_id
      header_columns: []
      topic: billing.{type}
    - table: audit.log
      topic: audit.$1
      topic_regex: (.*)
`)
	if err != nil {
		t.Fatal(err)
	}
	ls := cfg.OutboxConfig().Layouts()
	if len(ls) != 3 || ls[0].Name() != "public.outbox" || ls[1].Name() != "billing.events" || ls[2].Name() != "audit.log" {
		t.Fatalf("layouts %+v", ls)
	}
	if ls[0].Columns.ID != "id" || strings.Join(ls[0].HeaderColumns, ",") != "tenant" || ls[0].TimestampColumn != "created_at" {
		t.Fatalf("public.outbox did not take the top-level keys: %+v", ls[0])
	}
	if ls[1].Columns.ID != "event_id" || ls[1].Columns.Payload != "payload" || len(ls[1].HeaderColumns) != 0 || ls[1].TimestampColumn != "created_at" {
		t.Fatalf("billing.events: %+v", ls[1])
	}
	sc, err := SinkConfig(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Routes) != 2 || sc.Routes["billing.events"].Topic != "billing.{type}" || sc.Routes["audit.log"].TopicRegex != "(.*)" ||
		sc.CloudEventsSource != "/app/{table}" {
		t.Fatalf("routes %+v, ce_source %q", sc.Routes, sc.CloudEventsSource)
	}
	if l, err := cfg.Layout("billing.events"); err != nil || l.Columns.ID != "event_id" {
		t.Fatalf("Layout(billing.events): %+v, %v", l, err)
	}
	if _, err := cfg.Layout(""); err == nil || !strings.Contains(err.Error(), "public.outbox, billing.events, audit.log") {
		t.Fatalf("Layout() of several: %v", err)
	}
	if _, err := cfg.Layout("nope"); err == nil || !strings.Contains(err.Error(), "--table nope is not an outbox table") {
		t.Fatalf("Layout(nope): %v", err)
	}
	spec := cfg.PublicationSpec("p")
	if len(spec.Tables) != 3 || strings.Join(spec.Tables[1].Columns, ",") != "event_id,aggregatetype,aggregateid,type,payload,created_at" {
		t.Fatalf("publication spec %+v", spec)
	}

	// The environment's JSON, shown back as JSON.
	cfg, err = load(t, base, "WALRELAY_OUTBOX_TABLES", `[{"table": "a.x"}, {"table": "b.y", "payload_column": "body"}]`)
	if err != nil {
		t.Fatal(err)
	}
	if ls := cfg.OutboxConfig().Layouts(); len(ls) != 2 || ls[1].Columns.Payload != "body" {
		t.Fatalf("from the environment: %+v", ls)
	}
	os.Unsetenv("WALRELAY_OUTBOX_TABLES") // t.Setenv restores it at the end
	cs := NewSet(flag.NewFlagSet("", flag.ContinueOnError))
	cs.cfg.Outbox.Tables = cfg.Outbox.Tables
	if got := cs.byKey["outbox.tables"].show(); got != `[{"table":"a.x"},{"table":"b.y","payload_column":"body"}]` {
		t.Fatalf("shown as %s", got)
	}
	// One table by postgres.table: the layout a recovery command takes.
	cfg, err = load(t, strings.Replace(base, "postgres:\n", "postgres:\n  table: app.events\n", 1))
	if err != nil {
		t.Fatal(err)
	}
	if l, err := cfg.Layout(""); err != nil || l.Name() != "app.events" {
		t.Fatalf("one table: %+v %v", l, err)
	}

	for _, c := range []struct{ yaml, env, want string }{
		{"  tables:\n    - table: a.b.c\n", "", `entry 1: table "a.b.c": want schema.table`},
		{"  tables:\n    - table: x\n    - table: public.x\n", "", "table public.x is listed twice"},
		{"  tables:\n    - table: x\n      topic_regex: (.*)\n", "", "topic_regex needs topic"},
		{"  tables:\n    - table: x\n      topic: a{b}\n", "", "entry x: topic, topic_regex"},
		{"  tables:\n    - table: x\n      colour: red\n", "", "field colour not found"},
		{"  tables:\n    - table: x\n", "WALRELAY_POSTGRES_TABLE=public.outbox", "postgres.table (from the environment) and outbox.tables are both set"},
		{"  header_columns:\n    - {a: b}\n", "", "key outbox.header_columns: a list of plain values is expected"},
		{"", "WALRELAY_OUTBOX_TABLES=table: x", "want a list of tables"},
	} {
		var env []string
		if c.env != "" {
			k, v, _ := strings.Cut(c.env, "=")
			env = []string{k, v}
		}
		yaml := strings.Replace(base, "  header_columns: [tenant]\n", "", 1) + c.yaml
		if _, err := load(t, yaml, env...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q %s: %v, want %q", c.yaml, c.env, err, c.want)
		}
		if len(env) > 0 {
			os.Unsetenv(env[0])
		}
	}
}
