package textcut_test

import (
	"testing"
	"unicode/utf8"

	"github.com/walrelay/walrelay/internal/textcut"
)

// TestPrefixAtACharacter: a cut never splits a character, so what is left
// of UTF-8 is UTF-8; a short text is left whole; Clip marks a cut.
func TestPrefixAtACharacter(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{
		{"abc", 5, "abc"}, {"abc", 3, "abc"}, {"abc", 2, "ab"}, {"abc", 0, ""}, {"abc", -1, ""},
		{"aé", 2, "a"}, {"aé", 3, "aé"}, {"表表", 4, "表"}, {"表表", 2, ""},
	} {
		got := textcut.Prefix(c.s, c.n)
		if got != c.want || !utf8.ValidString(got) {
			t.Errorf("Prefix(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
	if got := textcut.Clip("aé", 2); got != "a…" {
		t.Errorf("Clip(%q, 2) = %q, want %q", "aé", got, "a…")
	}
	if got := textcut.Clip("ab", 2); got != "ab" {
		t.Errorf("Clip(%q, 2) = %q, want it whole", "ab", got)
	}
}
