package inbox

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walrelay/walrelay/format/registry"
)

// idRegistry is a registry over loopback that answers GET
// /schemas/ids/N with the Avro schema set for N (a 40403 for an id it
// lacks), counting the requests by id.
type idRegistry struct {
	url     string
	mu      sync.Mutex
	schemas map[int]string
	byID    map[int]int
}

func newIDRegistry(t *testing.T) *idRegistry {
	t.Helper()
	ir := &idRegistry{schemas: map[int]string{}, byID: map[int]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/schemas/ids/"))
		ir.mu.Lock()
		ir.byID[id]++
		schema, ok := ir.schemas[id]
		ir.mu.Unlock()
		if err != nil || !ok {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error_code": 40403, "message": "Schema not found"}`))
			return
		}
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		b, _ := json.Marshal(map[string]any{"schema": schema})
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	ir.url = srv.URL
	return ir
}

func (ir *idRegistry) register(id int, schema string) {
	ir.mu.Lock()
	defer ir.mu.Unlock()
	ir.schemas[id] = schema
}

func (ir *idRegistry) of(id int) int {
	ir.mu.Lock()
	defer ir.mu.Unlock()
	return ir.byID[id]
}

// TestRegistryUnusableReadBounded (a registry over loopback counting its
// requests): records framing a schema id the registry lacks, or one whose
// schema does not compile, ask the registry once per
// UnusableReadInterval, whatever their number (anyone who produces to the
// topic chooses the ids); the records in between are ErrUndecodable, as
// the first, without a request. Each record used to fetch (and compile)
// again.
func TestRegistryUnusableReadBounded(t *testing.T) {
	t.Parallel()
	const interval = 10 * time.Second
	for _, tc := range []struct {
		name   string
		schema string
	}{
		{"an id the registry lacks", ""},
		{"a schema that does not compile", `{"type":"record","name":"Broken","fields":[{"name":"x","type":"nosuchtype"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ir := newIDRegistry(t)
			const id = 41
			if tc.schema != "" {
				ir.register(id, tc.schema)
			}
			reg, err := NewRegistry(RegistryConfig{URL: ir.url, UnusableReadInterval: interval})
			if err != nil {
				t.Fatal(err)
			}
			var clock atomic.Int64
			start := time.Now()
			reg.now = func() time.Time { return start.Add(time.Duration(clock.Load())) }
			value := registry.Frame(nil, id, []byte{2})
			const n = 300
			decode := func() {
				t.Helper()
				for i := range n {
					var v any
					if err := reg.Decode(t.Context(), value, &v); !errors.Is(err, ErrUndecodable) {
						t.Fatalf("record %d: %v, want ErrUndecodable", i, err)
					}
				}
			}
			decode()
			if got := ir.of(id); got != 1 {
				t.Fatalf("%d records within the interval: %d requests, want 1", n, got)
			}
			clock.Add(int64(interval))
			decode()
			if got := ir.of(id); got != 2 {
				t.Fatalf("%d more records once the interval passed: %d requests in all, want 2", n, got)
			}
			ir.register(id, `{"type":"record","name":"R","fields":[{"name":"x","type":"long"}]}`)
			clock.Add(int64(interval))
			var v map[string]any
			if err := reg.Decode(t.Context(), value, &v); err != nil || v["x"] != int64(1) {
				t.Fatalf("the id registered, the interval passed: %v, %v; want x 1", v, err)
			}
		})
	}
}
