package sink

import (
	"strings"
	"testing"

	"github.com/walrelay/walrelay/sink/record"
)

// TestPassthroughConfig: registry_passthrough is a value format, with a
// registry's checker; a key in it, or a value without one, is refused.
func TestPassthroughConfig(t *testing.T) {
	if f, err := record.ParseFormat("registry_passthrough"); err != nil || f != record.FormatRegistryPassthrough {
		t.Fatalf("ParseFormat: %q, %v", f, err)
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Brokers: []string{"127.0.0.1:1"}, KeyFormat: record.FormatRegistryPassthrough}, "values only"},
		{Config{Brokers: []string{"127.0.0.1:1"}, ValueFormat: record.FormatRegistryPassthrough}, "no schema registry configured"},
	} {
		s, err := New(c.cfg)
		if err == nil {
			s.Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}
