package inbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/heappeak"
	"github.com/walrelay/walrelay/internal/testkit/longtest"
)

// schemaServer answers /schemas/ids/N with schema(N) of schemaType typ,
// and counts the requests.
func schemaServer(t *testing.T, typ string, schema func(id int) string) (string, *atomic.Int64) {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		id, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/schemas/ids/"))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		b, _ := json.Marshal(map[string]any{"schema": schema(id), "schemaType": typ})
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &requests
}

// TestRegistrySchemaCacheBoundedByBytes (from review43a's
// TestProbeRegistrySchemaCacheUnbounded): the Registry kept up to 10,000
// schemas, a bound on their number: schemas of 100 optional fields (5 KB
// of text) cost some 82 KB each cached, 802 MiB at the bound, for records
// of a few hundred bytes that each frame another id. The cache is bounded
// by the bytes of the schemas' text (format.MaxCachedSchemaBytes): what
// 1,000 such schemas leave cached stays some tens of MiB, whatever the
// number.
func TestRegistrySchemaCacheBoundedByBytes(t *testing.T) {
	longtest.Skip(t)
	url, _ := schemaServer(t, "AVRO", func(id int) string {
		var fields []string
		for i := range 100 {
			fields = append(fields, fmt.Sprintf(`{"name":"f%d_%d","type":["null","long"],"default":null}`, id, i))
		}
		return fmt.Sprintf(`{"type":"record","name":"r%d","fields":[%s]}`, id, strings.Join(fields, ","))
	})
	reg, err := NewRegistry(RegistryConfig{URL: url, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 100) // every field null
	decode := func(from, to int) {
		for id := from; id < to; id++ {
			var v map[string]any
			if err := reg.Decode(t.Context(), registry.Frame(nil, uint32(id), body), &v); err != nil {
				t.Fatal(err)
			}
		}
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	decode(1, 20) // the client's own first allocations
	before := heap()
	const n = 1000
	decode(1000, 1000+n)
	after := heap()
	reg.mu.Lock()
	cached, size := len(reg.schemas), reg.size
	reg.mu.Unlock()
	runtime.KeepAlive(reg)
	var held uint64
	if after > before {
		held = after - before
	}
	t.Logf("%d schemas decoded: %d cached, %d KiB of text, %d MiB of heap", n, cached, size>>10, held>>20)
	if size > format.MaxCachedSchemaBytes {
		t.Errorf("the cache holds %d bytes of schema text, more than its bound %d", size, format.MaxCachedSchemaBytes)
	}
	if held > 40<<20 {
		t.Errorf("%d distinct 100-field schemas decoded leave %d MiB of heap cached (%d schemas): bound the cache by bytes", n, held>>20, cached)
	}
}

// TestRegistryHugeSchemaRefused (from review43a's
// TestProbeRegistryHugeSchemaAnswer): an answer of the registry was read
// up to 16 MiB and its schema parsed whatever its size: a 2 MiB Avro
// schema (a record of some 70,000 fields; any id a record frames) cost a
// peak of 105 MiB of live heap and a second of CPU. A schema (with its
// references) over RegistryConfig.MaxSchemaBytes (512 KiB) is
// ErrUndecodable, not parsed, and an answer is read up to 8 times that.
func TestRegistryHugeSchemaRefused(t *testing.T) {
	longtest.Skip(t)
	var b strings.Builder
	b.WriteString(`{"type":"record","name":"R","fields":[`)
	for i := 0; b.Len() < 2<<20; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"f%d","type":"int"}`, i)
	}
	b.WriteString(`]}`)
	text := b.String()
	url, _ := schemaServer(t, "AVRO", func(int) string { return text })
	reg, err := NewRegistry(RegistryConfig{URL: url, Timeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var derr error
	start := time.Now()
	peak := heappeak.Of(func() {
		var v any
		derr = reg.Decode(t.Context(), registry.Frame(nil, 1, []byte{0}), &v)
	})
	t.Logf("a %d-byte schema: %v, err %v, peak live heap %d KiB", len(text), time.Since(start), derr, peak>>10)
	if !errors.Is(derr, ErrUndecodable) || !strings.Contains(derr.Error(), "more than the 524288 bytes of a schema") {
		t.Errorf("a record of a %d-byte schema: %v; want ErrUndecodable (a schema over 512 KiB)", len(text), derr)
	}
	if peak > 24<<20 {
		t.Errorf("one registry answer of %d bytes cost a peak of %d MiB of live heap", len(text), peak>>20)
	}

	// Within the bound it is parsed (and still some tens of MiB at its peak).
	small := text[:strings.LastIndex(text[:400<<10], `,{"name"`)] + `]}`
	url, _ = schemaServer(t, "AVRO", func(int) string { return small })
	reg, err = NewRegistry(RegistryConfig{URL: url, Timeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := reg.Decode(t.Context(), registry.Frame(nil, 1, make([]byte, 20000)), &v); err != nil && !strings.Contains(err.Error(), "decode in Avro") {
		t.Errorf("a record of a %d-byte schema: %v; want it decoded", len(small), err)
	}
}

// TestRegistryReferencesBounded (from review43a's
// TestProbeRegistryReferencesUnbounded): the references a schema lists
// were bounded in depth (10), not in number nor bytes: a schema id
// listing 2,000 references of 64 KB each made the inbox fetch and hold
// 125 MiB of schema text (a peak of 450 MiB) before it parsed any. At
// most registry.MaxReferences references, and at most MaxSchemaBytes of
// text with the schema's own, are fetched: past either, the record is
// ErrUndecodable, nothing more fetched.
func TestRegistryReferencesBounded(t *testing.T) {
	text := `{"type":"fixed","name":"F%d","size":1,"doc":"` + strings.Repeat("x", 64<<10) + `"}`
	small := `{"type":"fixed","name":"F%d","size":1}`
	for _, c := range []struct {
		name, ref string
		n         int
		most      int64 // requests
	}{
		{"2000 references of 64 KB", text, 2000, 10},
		{"2000 small references", small, 2000, registry.MaxReferences + 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			var requests atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
				if r.URL.Path == "/schemas/ids/1" {
					refs := make([]map[string]any, c.n)
					for i := range refs {
						refs[i] = map[string]any{"name": fmt.Sprintf("F%d", i), "subject": fmt.Sprintf("s%d", i), "version": 1}
					}
					b, _ := json.Marshal(map[string]any{"schema": `"string"`, "references": refs})
					_, _ = w.Write(b)
					return
				}
				var i int
				if _, err := fmt.Sscanf(r.URL.Path, "/subjects/s%d/versions/1", &i); err != nil {
					http.NotFound(w, r)
					return
				}
				b, _ := json.Marshal(map[string]any{"subject": fmt.Sprintf("s%d", i), "version": 1, "id": 100 + i, "schema": fmt.Sprintf(c.ref, i)})
				_, _ = w.Write(b)
			}))
			defer srv.Close()
			reg, err := NewRegistry(RegistryConfig{URL: srv.URL, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			var derr error
			peak := heappeak.Of(func() {
				var v any
				derr = reg.Decode(t.Context(), registry.Frame(nil, 1, []byte{0}), &v)
			})
			t.Logf("a schema of %d references: err %v, %d requests, peak live heap %d KiB", c.n, derr, requests.Load(), peak>>10)
			if !errors.Is(derr, ErrUndecodable) {
				t.Errorf("a schema of %d references: %v; want ErrUndecodable", c.n, derr)
			}
			if peak > 16<<20 || requests.Load() > c.most {
				t.Errorf("a schema of %d references cost a peak of %d MiB of live heap and %d requests", c.n, peak>>20, requests.Load())
			}
		})
	}
}
