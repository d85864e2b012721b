package decoder

import (
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
)

// TestIgnoredMessageKeepsAShortPrefix: an ignored message's prefix, chosen
// by any role and possibly megabytes long, is not handed on whole.
func TestIgnoredMessageKeepsAShortPrefix(t *testing.T) {
	t.Parallel()
	d, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 1<<20)
	for _, prefix := range []string{long, "walrelay"} {
		msg, err := d.message(0, &pglogrepl.LogicalDecodingMessage{Prefix: prefix, Content: []byte("y"), Transactional: true})
		if err != nil {
			t.Fatal(err)
		}
		ig, ok := msg.(Ignored)
		if !ok {
			t.Fatalf("%T, want Ignored", msg)
		}
		if len(ig.Prefix) > maxPrefixKept+len("…") {
			t.Fatalf("prefix of %d bytes handed on", len(ig.Prefix))
		}
	}
}
