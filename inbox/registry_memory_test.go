package inbox

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/walrelay/walrelay/format/registry"
)

// TestRegistryDecodersGoWithTheCache: decoding values of 1 000 distinct
// Avro schemas (walrelay's avro format registers one per payload shape)
// keeps nothing once the Registry is gone: hamba/avro's decoders are
// cached with the Registry's schemas, not in hamba/avro's package-wide
// configuration for ever (which kept them: 17 KB a schema here).
func TestRegistryDecodersGoWithTheCache(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		id, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/schemas/ids/"))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		var fields []string
		for i := range 20 {
			fields = append(fields, fmt.Sprintf(`{"name":"f%d_%d","type":["null","long"],"default":null}`, id, i))
		}
		schema := fmt.Sprintf(`{"type":"record","name":"r%d","fields":[%s]}`, id, strings.Join(fields, ","))
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		fmt.Fprintf(w, `{"schema":%q}`, schema)
	}))
	defer srv.Close()
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	body := make([]byte, 20) // every field null
	decode := func(reg *Registry, from, to int) {
		for id := from; id < to; id++ {
			var v map[string]any
			if err := reg.Decode(t.Context(), registry.Frame(nil, uint32(id), body), &v); err != nil {
				t.Fatal(err)
			}
			if len(v) != 20 {
				t.Fatalf("id %d: %v", id, v)
			}
		}
	}
	warm, err := NewRegistry(RegistryConfig{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	decode(warm, 1, 50) // the HTTP client's and the codecs' first allocations
	base := heap()
	reg, err := NewRegistry(RegistryConfig{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	decode(reg, 100, 1100)
	during := heap()
	runtime.KeepAlive(reg)
	reg = nil
	after := heap()
	t.Logf("heap: %d KiB before, %d KiB with 1000 schemas cached, %d KiB once the Registry is gone", base>>10, during>>10, after>>10)
	if after > base+(during-base)/4 {
		t.Errorf("%d KiB of %d stayed after the Registry went: decoders kept outside its cache", (after-base)>>10, (during-base)>>10)
	}
	runtime.KeepAlive(warm)
}
