package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMistakesAreOneLine: a mistyped flag, of any command, is refused in
// one line naming the likely flag (not the flag package's list of every
// flag), exit 2; several are named in that line, each with its likely flag
// (before, only the first); -h still lists the flags.
func TestMistakesAreOneLine(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--kafka.broker", "x"}, "walrelay: run: flag provided but not defined: -kafka.broker (did you mean --kafka.brokers?)"},
		{[]string{"run", "--kafka.broker", "x", "--postgres.slott=s", "--kafka.topik", "t", "--yes"},
			"walrelay: run: flags provided but not defined: -kafka.broker (did you mean --kafka.brokers?), -postgres.slott (did you mean --postgres.slot?), -kafka.topik (did you mean --kafka.topic?), -yes"},
		{[]string{"slot", "drop", "walrelay", "--yess"}, "(did you mean --yes?)"},
		{[]string{"replay", "--al"}, "(did you mean --all?)"},
		{[]string{"debezium", "import", "f", "--workr", "w"}, "(did you mean --worker?)"},
		{[]string{"nosuch"}, `walrelay: unknown command "nosuch"`},
		{[]string{"run", "extra"}, `unexpected argument "extra"`},
	} {
		var out, errOut bytes.Buffer
		code := realMain(t.Context(), c.args, &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), c.want) || strings.Count(errOut.String(), "\n") != 1 || out.Len() != 0 {
			t.Errorf("%v: exit %d, want 2 and one line with %q:\n%s%s", c.args, code, c.want, out.String(), errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := realMain(t.Context(), []string{"run", "-h"}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "-kafka.brokers") {
		t.Errorf("run -h: exit %d:\n%s", code, errOut.String())
	}
}

// TestMistakesOfEverySourceAtOnce: an undefined flag, a misspelt key of
// the file and a misspelt variable are named by one run: the flags' line,
// then the configuration's mistakes. Before, the flag alone, and the
// others one run each after it was fixed.
func TestMistakesOfEverySourceAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.yaml")
	if err := os.WriteFile(path, []byte("kafka:\n  brokerz: [k:9092]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("WALRELAY_POSTGRES_SLOTT", "s")
	var out, errOut bytes.Buffer
	code := realMain(t.Context(), []string{"run", "--kafka.topik", "t", "--config", path}, &out, &errOut)
	for _, want := range []string{
		"walrelay: run: flag provided but not defined: -kafka.topik (did you mean --kafka.topic?)",
		`unknown key "kafka.brokerz" (did you mean kafka.brokers?)`,
		"WALRELAY_POSTGRES_SLOTT names no configuration key (did you mean WALRELAY_POSTGRES_SLOT?)",
	} {
		if code != 2 || !strings.Contains(errOut.String(), want) {
			t.Errorf("exit %d, want 2 and %q:\n%s", code, want, errOut.String())
		}
	}
}

// TestHelpShowsItsOwnFlagsFirst: a command's -h lists its own flags in its
// first lines, then the configuration's keys under a heading of their own.
// Before, dlq replay's --id and --yes were among some 95 flags in one
// alphabetical list, --id after --heartbeat.interval.
func TestHelpShowsItsOwnFlagsFirst(t *testing.T) {
	for _, c := range []struct {
		args []string
		own  []string
	}{
		{[]string{"dlq", "replay", "-h"}, []string{"-id", "-all", "-yes", "-config"}},
		{[]string{"slot", "drop", "-h"}, []string{"-yes"}},
		{[]string{"replay", "--help"}, []string{"-all", "-yes"}},
	} {
		var out, errOut bytes.Buffer
		code := realMain(t.Context(), c.args, &out, &errOut)
		help := errOut.String()
		keys := strings.Index(help, "\nConfiguration keys (")
		if code != 0 || keys < 0 || !strings.Contains(help[keys:], "-kafka.brokers") {
			t.Errorf("%v: exit %d, want 0 and the keys under their heading:\n%s", c.args, code, help)
			continue
		}
		for _, f := range c.own {
			if i := strings.Index(help, "\n  "+f+" "); i < 0 || i > keys {
				if i = strings.Index(help, "\n  "+f+"\n"); i < 0 || i > keys {
					t.Errorf("%v: %s not among the command's own flags before the keys:\n%s", c.args, f, help[:keys])
				}
			}
		}
		if n := strings.Count(help[:keys], "\n  -"); n > 12 {
			t.Errorf("%v: %d flags before the keys, want the command's own few:\n%s", c.args, n, help[:keys])
		}
	}
}
