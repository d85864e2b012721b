package config

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// loadYAML loads text as the --config file, with the DSN from the
// environment unless the file gives it.
func loadYAML(t *testing.T, text string) (*Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "walrelay.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	cs := NewSet(fs)
	if err := fs.Parse([]string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	return cs.Load(fs, false)
}

// TestYAMLKeepsWhatWasWritten: a string key keeps the characters written,
// unquoted: YAML's hexadecimal, octal, float and long integer readings
// are not applied (before, 0x1F became 31, 0o17 15, 1.10 1.1 and a long
// digit string 1.2345678901234568e+22), in a scalar, a list and an
// outbox.tables entry alike.
func TestYAMLKeepsWhatWasWritten(t *testing.T) {
	cfg, err := loadYAML(t, `
postgres:
  dsn: host=db user=app
  slot: 0x1F
  publication: 0o17
outbox:
  message_prefix: 1.10
  header_columns: [0x10, 1e3, 007, yes]
  id_column: 12345678901234567890123
  tables:
    - table: public.outbox
      topic: 0x2A
      header_columns: [0b11]
kafka:
  client_id: ~walrelay
  transactional_id: 1_000
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ got, want string }{
		{cfg.Postgres.Slot, "0x1F"}, {cfg.Postgres.Publication, "0o17"}, {cfg.Outbox.MessagePrefix, "1.10"},
		{strings.Join(cfg.Outbox.HeaderColumns, ","), "0x10,1e3,007,yes"}, {cfg.Outbox.IDColumn, "12345678901234567890123"},
		{cfg.Outbox.Tables[0].Topic, "0x2A"}, {strings.Join(cfg.Outbox.Tables[0].HeaderColumns, ","), "0b11"},
		{cfg.Kafka.ClientID, "~walrelay"}, {cfg.Kafka.TransactionalID, "1_000"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q as written", c.got, c.want)
		}
	}
}

// TestYAMLKeyGivenTwice: a key given twice in one file, in any spelling
// (nested and dotted, twice nested, twice dotted), is refused naming both
// lines (before, map order chose one of them, differently from run to
// run, or the later silently won).
func TestYAMLKeyGivenTwice(t *testing.T) {
	for _, tc := range []struct{ name, text, want string }{
		{"nested and dotted", "postgres:\n  dsn: host=a\npostgres.dsn: host=b\n", "key postgres.dsn is given twice: line 2 and line 3"},
		{"dotted and nested", "postgres.dsn: host=b\npostgres:\n  dsn: host=a\n", "key postgres.dsn is given twice: line 1 and line 3"},
		{"mixed depth", "kafka:\n  sasl.password: a\nkafka.sasl:\n  password: b\npostgres.dsn: host=a\n", "key kafka.sasl.password is given twice: line 2 and line 4"},
		{"same map twice", "postgres:\n  dsn: host=a\npostgres:\n  slot: s\n", "key postgres is given twice: line 1 and line 3"},
		{"same key twice", "postgres:\n  dsn: host=a\n  dsn: host=b\n", "key postgres.dsn is given twice: line 2 and line 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadYAML(t, tc.text)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
