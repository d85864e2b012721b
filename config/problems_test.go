package config

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMisspeltKeysReportedAtOnce: two misspelt keys in the file, two
// misspelt variables and a bad flag value are reported by one Load, each
// on its line with the likely key, as debezium import reports its
// refusals. Before, only the file's first was named, and the next run
// named the next.
func TestMisspeltKeysReportedAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.yaml")
	if err := os.WriteFile(path, []byte("kafka:\n  brokerz: [k:9092]\npostgres:\n  slott: s\n  dsn: postgres://u@h/db\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("WALRELAY_KAFKA_BROKER", "a:9092")
	t.Setenv("WALRELAY_POSTGRES_TABL", "public.outbox")
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	cs := NewSet(fs)
	if err := fs.Parse([]string{"--config", path, "--postgres.create_slot", "maybe"}); err != nil {
		t.Fatal(err)
	}
	_, err := cs.Load(fs, false)
	if err == nil {
		t.Fatal("Load accepted misspelt keys")
	}
	msg := err.Error()
	for _, want := range []string{
		"5 mistakes in the configuration:",
		`unknown key "kafka.brokerz" (did you mean kafka.brokers?)`,
		`unknown key "postgres.slott" (did you mean postgres.slot?)`,
		"WALRELAY_KAFKA_BROKER names no configuration key (did you mean WALRELAY_KAFKA_BROKERS?)",
		"WALRELAY_POSTGRES_TABL names no configuration key (did you mean WALRELAY_POSTGRES_TABLE?)",
		"flag --postgres.create_slot: want true or false",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not name %q:\n%s", want, msg)
		}
	}
	if n := strings.Count(msg, "\n"); n != 5 {
		t.Errorf("%d lines, want a count and one a problem:\n%s", n+1, msg)
	}
}
