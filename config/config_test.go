package config

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/sink/record"
)

func TestConfigPrecedence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "walrelay.yaml")
	if err := os.WriteFile(path, []byte(`
postgres:
  dsn: postgres://file@localhost/db
  slot: from_file
kafka:
  brokers: [a:9092, b:9092]
  linger: 7ms
outbox:
  header_columns: [tenant, trace]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("WALRELAY_POSTGRES_SLOT", "from_env")
	t.Setenv("WALRELAY_KAFKA_TOPIC", "t.{type}")
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	cs := NewSet(fs)
	if err := fs.Parse([]string{"--config", path, "--kafka.topic", "from.flag"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := cs.Load(fs, true)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Postgres.DSN != "postgres://file@localhost/db" || cfg.Postgres.Slot != "from_env" || cfg.Kafka.Topic != "from.flag" {
		t.Fatalf("file < env < flag broken: dsn %q slot %q topic %q", cfg.Postgres.DSN, cfg.Postgres.Slot, cfg.Kafka.Topic)
	}
	if strings.Join(cfg.Kafka.Brokers, ",") != "a:9092,b:9092" || cfg.Kafka.Linger != 7*time.Millisecond {
		t.Fatalf("brokers %v linger %s", cfg.Kafka.Brokers, cfg.Kafka.Linger)
	}
	if strings.Join(cfg.Outbox.HeaderColumns, ",") != "tenant,trace" {
		t.Fatalf("header columns %v", cfg.Outbox.HeaderColumns)
	}
	if cfg.Postgres.Publication != "walrelay_outbox" || cfg.Kafka.DLQTopic != "walrelay.dlq" || cfg.Postgres.Table != "public.outbox" {
		t.Fatalf("defaults lost: %+v", cfg.Postgres)
	}
}

// TestEveryKeyHasItsVariable: the variables the README documents, spelt
// out, name their keys.
func TestEveryKeyHasItsVariable(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]string{
		"postgres.dsn":                   "WALRELAY_POSTGRES_DSN",
		"kafka.brokers":                  "WALRELAY_KAFKA_BROKERS",
		"kafka.sasl.password":            "WALRELAY_KAFKA_SASL_PASSWORD",
		"kafka.tls.ca_file":              "WALRELAY_KAFKA_TLS_CA_FILE",
		"outbox.ignore_message_prefixes": "WALRELAY_OUTBOX_IGNORE_MESSAGE_PREFIXES",
		"shutdown_timeout":               "WALRELAY_SHUTDOWN_TIMEOUT",
	} {
		if got := EnvName(key); got != want {
			t.Errorf("%s: variable %s, want %s", key, got, want)
		}
	}
	var c Config
	seen := map[string]string{}
	for _, k := range c.keys() {
		if other, ok := seen[EnvName(k.name)]; ok {
			t.Errorf("%s and %s share the variable %s", k.name, other, EnvName(k.name))
		}
		seen[EnvName(k.name)] = k.name
	}
}

// TestMisspeltVariableIsRefused: a WALRELAY_ variable that names no key is
// an error with the likely key, as an unknown key of the file is.
func TestMisspeltVariableIsRefused(t *testing.T) {
	t.Setenv("WALRELAY_POSTGRES_DSN", "postgres://u@h/db")
	t.Setenv("WALRELAY_KAFKA_BROKER", "a:9092")
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	cs := NewSet(fs)
	_, err := cs.Load(fs, false)
	if err == nil || !strings.Contains(err.Error(), "WALRELAY_KAFKA_BROKER names no configuration key (did you mean WALRELAY_KAFKA_BROKERS?)") {
		t.Fatalf("err = %v, want the misspelt variable named with its suggestion", err)
	}
}

// TestRedactDSN: a DSN is shown as pgconn parses it, rebuilt without its
// secrets, whatever the password holds; one that does not parse is not
// shown at all, nor any part of it, in RedactDSN, DSNError, ScrubError or
// Load's error. Every password is Sup3r, a separator and Secr3t. (Before,
// a regular expression left "Secr3t" after & @ and a space, and "Sup3r"
// before # and /, and pgconn's URL error quoted the DSN whole.)
func TestRedactDSN(t *testing.T) {
	dir := t.TempDir()
	passfile := dir + "/pgpass"
	if err := os.WriteFile(passfile, []byte("*:*:*:*:Sup3r:Secr3t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const kv = "host=db port=5433 user=app dbname=shop "
	const shown = "host=db port=5433 user=app dbname=shop sslmode="
	for _, tc := range []struct {
		dsn, pgpassword, want string
	}{
		{"postgres://app:Sup3r-Secr3t@db:5433/shop", "", shown + "prefer"},
		{"postgres://app:Sup3r@Secr3t@db:5433/shop?sslmode=disable", "", shown + "disable"},
		{"postgres://app:Sup3r%23Secr3t@db:5433/shop?sslmode=require", "", shown + "require"},
		{"postgres://app:Sup3r%25Secr3t@db:5433/shop?sslmode=allow", "", shown + "allow"},
		{"postgres://app:Sup3r&Secr3t@db:5433/shop?sslmode=verify-full&application_name=relay%201", "", shown + "verify-full application_name='relay 1'"},
		{"postgres://app@db:5433/shop?password=Sup3r%26Secr3t&sslpassword=Sup3r%20Secr3t&sslmode=disable", "", shown + "disable"},
		{"postgres://app:Sup3r@Secr3t@db:5433,db2:5434/shop?sslmode=disable&connect_timeout=3", "", "host=db,db2 port=5433,5434 user=app dbname=shop sslmode=disable connect_timeout=3"},
		{kv + "password=Sup3r&Secr3t sslmode=disable", "", shown + "disable"},
		{kv + "password='Sup3r Secr3t' sslmode=disable", "", shown + "disable"},
		{kv + `password='Sup3r\' \\Secr3t' sslmode=disable`, "", shown + "disable"},
		{kv + "password=Sup3r#Secr3t sslpassword='Sup3r Secr3t' sslmode=disable", "", shown + "disable"},
		{kv + "passfile=" + passfile + " sslmode=disable", "", shown + "disable"},
		{kv + "sslmode=disable", "Sup3r Secr3t", shown + "disable"},
		{kv + "sslmode=disable search_path='a b\\c'", "", shown + `disable search_path='a b\\c'`},
		{"postgres://app:Sup3r Secr3t@db:5433/shop", "", "unparseable DSN: failed to parse as URL (invalid characters in the user or password: percent-encode @ # / ? % : and spaces in the user and password)"},
		{"postgres://app:Sup3r#Secr3t@db:5433/shop", "", "unparseable DSN: failed to parse as URL (an invalid port after the host: percent-encode @ # / ? % : and spaces in the user and password)"},
		{"postgres://app:Sup3r/Secr3t@db:5433/shop", "", "unparseable DSN: failed to parse as URL (an invalid port after the host: percent-encode @ # / ? % : and spaces in the user and password)"},
		{"postgres://app:Sup3r%zzSecr3t@db:5433/shop", "", "unparseable DSN: failed to parse as URL (an invalid %-escape: percent-encode @ # / ? % : and spaces in the user and password)"},
		{kv + "password='Sup3r Secr3t", "", "unparseable DSN: failed to parse as DSN (unterminated quoted string in connection info string)"},
		{kv + "password=Sup3r Secr3t", "", "unparseable DSN: failed to parse as DSN (invalid dsn)"},
		{"host=db port=Sup3rSecr3t user=app", "", "unparseable DSN: invalid port (invalid syntax)"},
		{"", "", ""},
	} {
		t.Run(tc.dsn, func(t *testing.T) {
			t.Setenv("PGPASSWORD", tc.pgpassword)
			if tc.pgpassword == "" {
				os.Unsetenv("PGPASSWORD")
			}
			noSecret := func(what, s string) {
				t.Helper()
				if strings.Contains(s, "Sup3r") || strings.Contains(s, "Secr3t") {
					t.Errorf("%s shows the password: %s", what, s)
				}
			}
			got := RedactDSN(tc.dsn)
			noSecret("RedactDSN", got)
			if got != tc.want {
				t.Errorf("RedactDSN = %q, want %q", got, tc.want)
			}
			_, perr := pgconn.ParseConfig(tc.dsn)
			if perr != nil {
				noSecret("DSNError", DSNError(perr).Error())
				noSecret("ScrubError", ScrubError(fmt.Errorf("connect: %w", perr), nil).Error())
			}
			if tc.dsn == "" {
				return
			}
			t.Setenv("WALRELAY_POSTGRES_DSN", tc.dsn)
			fs := flag.NewFlagSet("run", flag.ContinueOnError)
			cs := NewSet(fs)
			cfg, err := cs.Load(fs, false)
			if err != nil {
				noSecret("Load", err.Error())
				if perr == nil || err.Error() != "postgres.dsn: "+tc.want {
					t.Errorf("Load: %v, want postgres.dsn: %s", err, tc.want)
				}
				return
			}
			if perr != nil {
				t.Fatalf("Load took a DSN pgconn refuses: %v", perr)
			}
			yml, err := cs.YAML()
			if err != nil {
				t.Fatal(err)
			}
			noSecret("YAML", yml)
			noSecret("Summary", fmt.Sprint(cs.Summary()...))
			noSecret("Effective", fmt.Sprint(cs.Effective()...))
			if c, _ := pgconn.ParseConfig(tc.dsn); c.Password != "" && !slices.Contains(cfg.Secrets(), c.Password) {
				t.Errorf("Secrets() %d values, without the parsed password: it is not scrubbed from errors", len(cfg.Secrets()))
			}
		})
	}
}

// TestExampleConfigLoads keeps walrelay.example.yaml in step with the keys.
func TestExampleConfigLoads(t *testing.T) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	cs := NewSet(fs)
	if err := fs.Parse([]string{"--config", "../walrelay.example.yaml"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Load(fs, true); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../walrelay.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range cs.keys {
		leaf := k.name[strings.LastIndex(k.name, ".")+1:]
		if !strings.Contains(string(b), leaf+":") {
			t.Errorf("walrelay.example.yaml does not show %s", k.name)
		}
	}
}

var update = flag.Bool("update", false, "write docs/configuration.md's table of keys from the declaration")

// TestConfigurationReference: the table of keys in docs/configuration.md is
// the one Reference generates from the keys' declaration (-update writes
// it), so every key has its row with its default and meaning.
func TestConfigurationReference(t *testing.T) {
	const page, begin, end = "../docs/configuration.md", "<!-- keys: begin -->\n", "<!-- keys: end -->"
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s: no %q and %q around the table of keys", page, begin, end)
	}
	want := doc[:i+len(begin)] + Reference() + doc[j:]
	if *update {
		if err := os.WriteFile(page, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if doc != want {
		t.Fatalf("%s: the table of keys is not the declaration's: go test ./config -run TestConfigurationReference -update", page)
	}
	for name := range defaultMeaning {
		if !strings.Contains(Reference(), "| `"+name+"` ") {
			t.Errorf("defaultMeaning names %s, which is no key", name)
		}
	}
}

// TestSourcePoll: source poll and its keys load from the file and the
// environment into the poller's configuration; exactly-once, an unknown
// source and bad poll settings are refused with the key named.
func TestSourcePoll(t *testing.T) {
	base := "postgres:\n  dsn: postgres://u@h/db\nkafka:\n  brokers: [a:9092]\n"
	c, err := load(t, base+"source: poll\npoll:\n  lease: 5s\n  on_dead: block\n", "WALRELAY_POLL_BATCH_SIZE", "250")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := c.PollConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Source != "poll" || pc.Lease != 5*time.Second || pc.OnDead != "block" || pc.BatchSize != 250 || pc.MaxAttempts != 20 || pc.Ordering != "aggregate" || pc.Interval != time.Second ||
		pc.ConnConfig.Database != "db" || pc.Outbox.Layout.Table != "outbox" {
		t.Fatalf("poll config %+v", pc)
	}
	for _, bad := range []struct{ yaml, want string }{
		{"source: poll\nkafka:\n  exactly_once: true\n", "kafka.exactly_once needs source wal"},
		{"source: polling\n", `source "polling": want wal or poll`},
		{"source: poll\npoll:\n  ordering: strict\n", `poll.ordering "strict"`},
		{"source: poll\npoll:\n  on_dead: drop\n", `poll.on_dead "drop"`},
		{"source: poll\npoll:\n  lease: 100ms\n", "poll.lease 100ms: want at least 1s"},
		{"source: poll\npoll:\n  max_attempts: 0\n", "want at least 1"}, // (batch_size is set by the environment above)
		{"source: poll\noutbox:\n  header_columns: [correlation_id:id]\n", `its header "id" is reserved`},
		{"outbox:\n  header_columns: [walrelay.table]\n", `its header "walrelay.table" is reserved`},
	} {
		yaml := base + bad.yaml
		if strings.Contains(bad.yaml, "kafka:") {
			yaml = "postgres:\n  dsn: postgres://u@h/db\nsource: poll\nkafka:\n  brokers: [a:9092]\n  exactly_once: true\n"
		}
		if _, err := load(t, yaml); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: err = %v, want %q", bad.yaml, err, bad.want)
		}
	}
}

// TestTransactionTimeout: kafka.transaction_timeout loads into the sink's
// transactions; an interval that would let a transaction near it is
// refused, naming both keys.
func TestTransactionTimeout(t *testing.T) {
	base := "postgres:\n  dsn: postgres://u@h/db\nkafka:\n  brokers: [a:9092]\n  exactly_once: true\n"
	c, err := load(t, base+"  transaction_timeout: 2m\n  transaction_interval: 20s\n")
	if err != nil {
		t.Fatal(err)
	}
	sc, err := SinkConfig(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Transactions == nil || sc.Transactions.Timeout != 2*time.Minute || sc.Transactions.Interval != 20*time.Second {
		t.Fatalf("transactions %+v", sc.Transactions)
	}
	_, err = load(t, base+"  transaction_interval: 15s\n")
	if want := "kafka.transaction_interval 15s must be under a quarter of kafka.transaction_timeout 1m0s"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want %q", err, want)
	}
}

// TestYAMLReadsBack: walrelay config's YAML says where each value came from
// (default, the file, the environment, a flag), hides secrets, and read
// back as a configuration file gives every key the same value.
func TestYAMLReadsBack(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "walrelay.yaml")
	if err := os.WriteFile(file, []byte(`postgres:
  dsn: "postgres://u:s3cret@h/app"
kafka:
  brokers: [a:9092, "b:9092"]
  sasl:
    mechanism: SCRAM-SHA-512
    username: relay
    password: "p#w: d"
outbox:
  header_columns: [trace_id, "tenant:x-tenant"]
  tables:
    - table: public.orders_outbox
      topic: orders.{aggregatetype}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("WALRELAY_KAFKA_LINGER", "7ms")
	fs := flag.NewFlagSet("config", flag.ContinueOnError)
	cs := NewSet(fs)
	if err := fs.Parse([]string{"--config", file, "--kafka.client_id", "relay 1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Load(fs, true); err != nil {
		t.Fatal(err)
	}
	out, err := cs.YAML()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`dsn: host=h port=5432 user=u dbname=app sslmode=prefer # from ` + file, `linger: 7ms # from WALRELAY_KAFKA_LINGER`,
		`client_id: relay 1 # from --kafka.client_id`, `slot: walrelay # default`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "s3cret") || strings.Contains(out, "p#w") {
		t.Errorf("a secret is printed:\n%s", out)
	}
	back := filepath.Join(dir, "back.yaml")
	if err := os.WriteFile(back, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Unsetenv("WALRELAY_KAFKA_LINGER")
	fs2 := flag.NewFlagSet("config", flag.ContinueOnError)
	cs2 := NewSet(fs2)
	if err := fs2.Parse([]string{"--config", back}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs2.Load(fs2, true); err != nil {
		t.Fatalf("read back: %v\n%s", err, out)
	}
	for i, k := range cs.keys {
		if k.redact != nil && k.show() != "" {
			continue
		}
		if got := cs2.keys[i].show(); got != k.show() {
			t.Errorf("%s: %q read back as %q", k.name, k.show(), got)
		}
	}
}

// TestSchemaRegistryKeys: kafka.value_format and kafka.key_format avro
// give the sink an Avro encoder of the registry of
// kafka.schema_registry.*; what cannot work is refused at load, naming the
// key; the registry's password is one of the secrets scrubbed from errors.
func TestSchemaRegistryKeys(t *testing.T) {
	base := "postgres:\n  dsn: postgres://u@h/db\nkafka:\n  brokers: [a:9092]\n"
	for _, bad := range []struct{ yaml, want string }{
		{"  value_format: avro\n", "kafka.key_format or kafka.value_format avro needs kafka.schema_registry.url"},
		{"  value_format: protobuf\n", `format "protobuf": want raw, json, json_schema, avro, registry_passthrough, registered_avro, registered_protobuf or registered_jsonschema`},
		{"  value_format: registry_passthrough\n", "kafka.value_format registry_passthrough needs kafka.schema_registry.url"},
		{"  key_format: registry_passthrough\n  schema_registry:\n    url: http://r/x\n", "kafka.key_format registry_passthrough: values only"},
		{"  value_format: registry_passthrough\n  schema_registry:\n    url: https://r/x\n    tls_cert_file: /c.pem\n", "kafka.schema_registry.tls_cert_file is set without kafka.schema_registry.tls_key_file"},
		{"  value_format: avro\n  schema_registry:\n    url: https://r/x\n    tls_ca_file: /nonexistent/ca.pem\n", "kafka.schema_registry.tls_ca_file: open /nonexistent/ca.pem"},
		{"  value_format: registered_avro\n  schema_registry:\n    url: https://r/x\n    tls_ca_file: /nonexistent/ca.pem\n", "kafka.schema_registry.tls_ca_file: open /nonexistent/ca.pem"},
		{"  value_format: avro\n  schema_registry:\n    url: http://r/x\n    id_kind: globalId\n", `kafka.schema_registry.id_kind "globalId"`},
		{"  value_format: avro\n  schema_registry:\n    url: http://u:hunter2@r/x\n", "kafka.schema_registry.url holds credentials"},
		// A token as the user, without a password, is a secret too.
		{"  value_format: avro\n  schema_registry:\n    url: http://hunter2@r/x\n", "kafka.schema_registry.url holds credentials"},
		{"  value_format: registry_passthrough\n  schema_registry:\n    url: https://hunter2:@r/x\n", "kafka.schema_registry.username"},
		// A token in the query or fragment: franz-go keeps the query on
		// each request and its errors print the URL whole (review44).
		{"  value_format: avro\n  schema_registry:\n    url: http://r/x?access_token=hunter2\n", "kafka.schema_registry.url has a query or fragment"},
		{"  value_format: registry_passthrough\n  schema_registry:\n    url: https://r:8081#hunter2\n", "kafka.schema_registry.url has a query or fragment"},
		{"  value_format: avro\n  schema_registry:\n    url: u:hunter2@r:8081\n", "want an http or https URL"},
		{"  value_format: avro\n  schema_registry:\n    url: ftp://r/x\n", "want an http or https URL"},
		{"  value_format: avro\n  schema_registry:\n    url: http://r/x\n    password: p\n", "needs kafka.schema_registry.username"},
	} {
		_, err := load(t, base+bad.yaml)
		if err == nil {
			c, _ := load(t, base+bad.yaml)
			_, err = SinkConfig(c, nil)
		}
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: err = %v, want %q", bad.yaml, err, bad.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%q: the error shows the password: %v", bad.yaml, err)
		}
	}
	// Last: the password set in the environment stays for the test.
	c, err := load(t, base+"  value_format: avro\n  key_format: avro\n  expand_json_payload: true\n  schema_registry:\n    url: http://r:8080/apis/ccompat/v7\n    username: u\n    auto_register: true\n",
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_PASSWORD", "s3cr3t-pw")
	if err != nil {
		t.Fatal(err)
	}
	sc, err := SinkConfig(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sc.ValueFormat != record.FormatAvro || sc.KeyFormat != record.FormatAvro || sc.Avro == nil || !sc.ExpandJSONPayload {
		t.Fatalf("sink config: value %s key %s avro %v", sc.ValueFormat, sc.KeyFormat, sc.Avro)
	}
	if r := c.Kafka.SchemaRegistry; !r.AutoRegister || r.IDKind != "contentId" || r.Timeout != 10*time.Second {
		t.Errorf("schema registry %+v", r)
	}
	if !slices.Contains(c.Secrets(), "s3cr3t-pw") {
		t.Errorf("the registry's password is not among the secrets")
	}
}

// TestPasswordFiles: kafka.sasl.password_file and
// kafka.schema_registry.password_file are read (the final newline
// dropped) into the password they stand for, which is then a secret; a
// missing or empty file is refused naming its key, and so is a password
// set as well, naming both keys.
func TestPasswordFiles(t *testing.T) {
	dir := t.TempDir()
	pw, empty := filepath.Join(dir, "pw"), filepath.Join(dir, "empty")
	if err := os.WriteFile(pw, []byte("s3cr3t-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "postgres:\n  dsn: postgres://u@h/db\nkafka:\n  brokers: [a:9092]\n"
	sasl := func(more string) string { return "  sasl:\n    mechanism: PLAIN\n    username: u\n" + more }
	registry := func(more string) string { return "  schema_registry:\n    url: http://r/x\n    username: u\n" + more }
	c, err := load(t, base+sasl("    password_file: "+pw+"\n")+registry("    password_file: "+pw+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Kafka.SASL.Password != "s3cr3t-file" || c.Kafka.SchemaRegistry.Password != "s3cr3t-file" || !slices.Contains(c.Secrets(), "s3cr3t-file") {
		t.Fatalf("the files' password: SASL %q, registry %q, a secret %v; want s3cr3t-file in both, and a secret",
			c.Kafka.SASL.Password, c.Kafka.SchemaRegistry.Password, slices.Contains(c.Secrets(), "s3cr3t-file"))
	}
	for _, bad := range []struct{ yaml, want string }{
		{sasl("    password: p\n    password_file: " + pw + "\n"), "kafka.sasl.password_file and kafka.sasl.password are both set: keep one"},
		{registry("    password: p\n    password_file: " + pw + "\n"), "kafka.schema_registry.password_file and kafka.schema_registry.password are both set: keep one"},
		{sasl("    password_file: " + filepath.Join(dir, "missing") + "\n"), "kafka.sasl.password_file: open " + filepath.Join(dir, "missing")},
		{registry("    password_file: " + empty + "\n"), "kafka.schema_registry.password_file: " + empty + " is empty"},
	} {
		if _, err := load(t, base+bad.yaml); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: err = %v, want %q", bad.yaml, err, bad.want)
		}
	}
}

// TestSoftMemoryLimit: memory_limit as set, else kafka.max_buffered_bytes
// + 16 MiB: with the default buffers 32 MiB, which with the binary's own
// resident pages (about 27 MiB, outside the Go runtime's limit) keeps a
// walrelay under its 64 MiB budget.
func TestSoftMemoryLimit(t *testing.T) {
	base := "postgres:\n  dsn: postgres://u@h/db\nkafka:\n  brokers: [a:9092]\n"
	cases := []struct {
		name, yaml string
		want       int64
	}{
		{"default buffers", base, 32 << 20},
		{"larger buffers", base + "  max_buffered_bytes: 67108864\n", 80 << 20},
		{"smaller buffers", base + "  max_buffered_bytes: 2000000\n  batch_max_bytes: 1000000\n", 2000000 + 16<<20},
		{"set", base + "memory_limit: 100000000\n", 100000000},
		{"set, below the derived", base + "memory_limit: 20000000\n", 20000000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := load(t, c.yaml)
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.SoftMemoryLimit(); got != c.want {
				t.Fatalf("SoftMemoryLimit() = %d (%.1f MiB), want %d (%.1f MiB)", got, float64(got)/(1<<20), c.want, float64(c.want)/(1<<20))
			}
		})
	}
}
