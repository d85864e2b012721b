package format

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/longtest"
)

// TestPassthroughKnownEvictsOneAtATime (a registry over loopback counting
// its requests by id): values cycling through more ids than the cache of
// known ids holds (maxCachedIDs) drop the least recently used one at a
// time: an id in use meanwhile stays known, asked for once. The cache
// used to be cleared whole when full: every id asked for again.
func TestPassthroughKnownEvictsOneAtATime(t *testing.T) {
	longtest.Skip(t)
	t.Parallel()
	var mu sync.Mutex
	byID := map[int]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest := strings.TrimPrefix(r.URL.Path, "/schemas/ids/")
		id, _ := strconv.Atoi(strings.TrimSuffix(rest, "/versions"))
		mu.Lock()
		byID[id]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		if strings.HasSuffix(rest, "/versions") {
			_, _ = w.Write([]byte(`[{"subject":"orders-value","version":1}]`))
			return
		}
		_, _ = w.Write([]byte(`{"schema":"\"string\""}`))
	}))
	t.Cleanup(srv.Close)
	p := mustPassthrough(t, mustRegistry(t, registry.Config{URL: srv.URL}), PassthroughConfig{})
	const hot, others = 1, registry.MaxCachedIDs + 500
	check := func(id int) {
		t.Helper()
		if err := p.Check(t.Context(), "orders", "", registry.Frame(nil, uint32(id), []byte{2, 'a'})); err != nil {
			t.Fatalf("id %d: %v", id, err)
		}
	}
	for id := 100; id < 100+others; id++ {
		check(id)
		if id%100 == 0 {
			check(hot)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if got := byID[hot]; got != 2 {
		t.Errorf("an id in use while %d others cycle through the cache: %d requests, want 2 (the schema and its subjects, once)", others, got)
	}
}
