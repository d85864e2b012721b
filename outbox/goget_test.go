package outbox_test

import (
	"os"
	"strings"
	"testing"
)

// TestDocsSayHowToGetThePackages: where the README and docs/ introduce a Go
// package (outbox in the README and docs/outbox.md, inbox in
// docs/exactly-once.md and docs/inbox.md, relay in docs/how-it-works.md),
// they give the go get line of the module go.mod declares and the import
// path. Before, they gave none.
func TestDocsSayHowToGetThePackages(t *testing.T) {
	t.Parallel()
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	module, _, _ := strings.Cut(strings.TrimPrefix(string(mod), "module "), "\n")
	for doc, pkg := range map[string]string{"../README.md": "outbox", "../docs/outbox.md": "outbox", "../docs/exactly-once.md": "inbox", "../docs/inbox.md": "inbox", "../docs/how-it-works.md": "relay"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(string(b)), " ") // lines rewrapped
		for _, want := range []string{"go get " + module + "@latest", module + "/" + pkg} {
			if !strings.Contains(text, want) {
				t.Errorf("%s: does not say %q", doc, want)
			}
		}
	}
}
