package inbox

import (
	"fmt"
	"strings"
	"testing"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/longtest"
)

// TestRegistryCacheEvictsOneAtATime (a registry over loopback counting
// its requests by id): records cycling through more schemas than the
// cache holds (format.MaxCachedSchemaBytes of their text) drop the least
// recently used one at a time: a schema in use meanwhile stays cached,
// fetched once. The cache used to be cleared whole when full: every
// schema fetched and compiled again.
func TestRegistryCacheEvictsOneAtATime(t *testing.T) {
	longtest.Skip(t)
	t.Parallel()
	ir := newIDRegistry(t)
	schema := func(id int) string {
		var fields []string
		for i := range 100 {
			fields = append(fields, fmt.Sprintf(`{"name":"f%d_%d","type":["null","long"],"default":null}`, id, i))
		}
		return fmt.Sprintf(`{"type":"record","name":"r%d","fields":[%s]}`, id, strings.Join(fields, ","))
	}
	const hot, others = 1, 800 // some 5 KB of text each: twice the cache
	ir.register(hot, schema(hot))
	for id := 100; id < 100+others; id++ {
		ir.register(id, schema(id))
	}
	reg, err := NewRegistry(RegistryConfig{URL: ir.url})
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 100) // every field null
	decode := func(id int) {
		t.Helper()
		var v map[string]any
		if err := reg.Decode(t.Context(), registry.Frame(nil, uint32(id), body), &v); err != nil || len(v) != 100 {
			t.Fatalf("id %d: %d fields, %v", id, len(v), err)
		}
	}
	for id := 100; id < 100+others; id++ {
		decode(id)
		if id%20 == 0 {
			decode(hot)
		}
	}
	if got := ir.of(hot); got != 1 {
		t.Errorf("a schema in use while %d others cycle through the cache: %d requests, want 1", others, got)
	}
	reg.mu.Lock()
	size := reg.size
	reg.mu.Unlock()
	if size > format.MaxCachedSchemaBytes {
		t.Errorf("the cache holds %d bytes of schema text, more than its bound %d", size, format.MaxCachedSchemaBytes)
	}
}
