package config

import (
	"strings"
	"testing"
)

// TestVersionColumn: outbox.version_column reaches the decoder's layout,
// an outbox.tables entry's version_column overrides it, and a name
// walrelay could not write into SQL is refused at load, naming the column's
// setting.
func TestVersionColumn(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, yaml string
		want       []string // each table's version column
		err        string
	}{
		{"top level", "outbox:\n  version_column: aggregate_version\n", []string{"aggregate_version"}, ""},
		{"per table", "outbox:\n  version_column: v\n  tables:\n    - table: public.a\n    - table: public.b\n      version_column: w\n", []string{"v", "w"}, ""},
		{"unset", "", []string{""}, ""},
		{"control character", "outbox:\n  version_column: \"v\\u0007\"\n", nil, "version column"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := load(t, "postgres:\n  dsn: postgres://u@h/db\nkafka:\n  brokers: [k:9092]\n"+c.yaml)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, l := range cfg.OutboxConfig().Layouts() {
				got = append(got, l.VersionColumn)
			}
			if strings.Join(got, ",") != strings.Join(c.want, ",") {
				t.Fatalf("version columns %q, want %q", got, c.want)
			}
		})
	}
}
