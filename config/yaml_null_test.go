package config

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestYAMLNullAndDocuments: a value is the text as written. An unquoted
// null, Null, NULL or ~ (YAML's null, a plausible password or prefix) is
// refused, naming the key, its line and how to write it, rather than read
// as empty; nothing written, or an empty quoted string, is empty; a quoted
// 'null' is the text.
// A second YAML document is refused with its line rather than ignored.
func TestYAMLNullAndDocuments(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, file, want, err string }{
		{"null", "kafka:\n  sasl:\n    password: null\n", "", "key kafka.sasl.password: line 3: an unquoted null is YAML's null"},
		{"Null", "kafka:\n  sasl:\n    password: Null\n", "", "write '' for an empty value"},
		{"NULL", "kafka.sasl.password: NULL\n", "", "line 1"},
		{"tilde", "kafka:\n  sasl:\n    password: ~\n", "", "unquoted ~"},
		{"null in a list", "kafka:\n  brokers: [a:9092, null]\n", "", "key kafka.brokers"},
		{"nothing written", "kafka:\n  sasl:\n    password:\n", "", ""},
		{"quoted empty", "kafka:\n  sasl:\n    password: ''\n", "", ""},
		{"quoted null", "kafka:\n  sasl:\n    password: 'null'\n", "null", ""},
		{"second document", "kafka:\n  sasl:\n    username: u\n---\nkafka:\n  sasl:\n    password: Second\n", "", "line 5: a second YAML document"},
		{"a document marker first", "---\nkafka:\n  sasl:\n    password: p\n", "p", ""},
		{"an empty document after", "kafka:\n  sasl:\n    password: p\n---\n", "p", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(p, []byte(c.file), 0o600); err != nil {
				t.Fatal(err)
			}
			cs := NewSet(flag.NewFlagSet("x", flag.ContinueOnError))
			err := cs.LoadFile(p)
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("%q: %v", c.file, err)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("%q: error %v, want one with %q (password read as %q)", c.file, err, c.err, cs.Config().Kafka.SASL.Password)
			case c.err == "":
				if got := cs.Config().Kafka.SASL.Password; got != c.want {
					t.Fatalf("%q: password %q, want %q", c.file, got, c.want)
				}
			}
		})
	}
}
