package config

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKafkaHeaders: kafka.headers chooses the headers besides id: by
// default all four, an empty list none (id alone, as Debezium's
// EventRouter), a list some; id may be listed (it is always sent); an
// unknown name is refused naming the ones there are.
func TestKafkaHeaders(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, yaml, omit, err string
	}{
		{"default", "", "", ""},
		{"none", "kafka:\n  headers: []\n", "type,walrelay.lsn,walrelay.xid,walrelay.commit_time", ""},
		{"id and type", "kafka:\n  headers: [id, type]\n", "walrelay.lsn,walrelay.xid,walrelay.commit_time", ""},
		{"unknown", "kafka:\n  headers: [type, walrelay.lns]\n", "", `kafka.headers: unknown header "walrelay.lns": want any of type, walrelay.lsn, walrelay.xid, walrelay.commit_time (id is always sent)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "w.yaml")
			if err := os.WriteFile(path, []byte("postgres:\n  dsn: postgres://u@h/db\n"+c.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			fs := flag.NewFlagSet("run", flag.ContinueOnError)
			cs := NewSet(fs)
			if err := fs.Parse([]string{"--config", path}); err != nil {
				t.Fatal(err)
			}
			cfg, err := cs.Load(fs, false)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			sc, err := SinkConfig(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(sc.OmitHeaders, ","); got != c.omit {
				t.Fatalf("headers left out: %q, want %q", got, c.omit)
			}
		})
	}
}
