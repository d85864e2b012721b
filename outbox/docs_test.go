package outbox_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsShowCompiledExamples: every Go block of the README and of docs/
// is, line for line, part of an example file that the packages' tests
// compile (example_*test.go in outbox, inbox and relay), so that a snippet
// a user copies builds and handles its errors.
func TestDocsShowCompiledExamples(t *testing.T) {
	t.Parallel()
	var examples strings.Builder
	for _, dir := range []string{".", "../inbox", "../relay"} {
		files, err := filepath.Glob(filepath.Join(dir, "example*_test.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			examples.WriteString(normalize(string(b)))
		}
	}
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := 0
	for _, doc := range append(docs, "../README.md") {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
			blocks++
			if !strings.Contains(examples.String(), normalize(m[1])) {
				t.Errorf("%s: a Go block that no example file holds (add it to an example_*_test.go as is):\n%s", doc, m[1])
			}
		}
	}
	if blocks < 4 {
		t.Fatalf("%d Go blocks in the README and docs/: want the writer, the consumer, the aggregate version and the embedded relay", blocks)
	}
}

// normalize drops indentation and blank lines.
func normalize(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
