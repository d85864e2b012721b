package shellquote_test

import (
	"os/exec"
	"testing"

	"github.com/walrelay/walrelay/internal/shellquote"
)

// TestArgReadsBackThroughAShell: each value, quoted by Arg and given to a
// real sh, arrives as one argument, as it was.
func TestArgReadsBackThroughAShell(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"public.outbox", `x; echo pwned`, "$(echo pwned)", "`echo pwned`", "it's", `a\b`, "two words", "ünï", "a'b'c", "*", ""} {
		got, err := exec.Command("sh", "-c", "printf '%s|' "+shellquote.Arg(v)).Output()
		if err != nil {
			t.Errorf("%q quoted %s: %v", v, shellquote.Arg(v), err)
			continue
		}
		if string(got) != v+"|" {
			t.Errorf("%q quoted %s reads back as %q", v, shellquote.Arg(v), got)
		}
	}
}
