package format

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/format/registry"
)

// distinctObjects is a payload {"items":[{"k0":1},{"k1":1},…]} of n
// objects, each with a key of its own: the merged item record has n
// fields, and each element written in it n-1 nulls.
func distinctObjects(n int) string {
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"k%d":1}`, i)
	}
	b.WriteString("]}")
	return b.String()
}

// TestItemSchemaMergeLinear: the distinct schemas of an array's objects
// are merged in time about linear in them: 60 000 objects, each with a key
// of its own, are inferred in about half a second under the race detector
// on a loaded machine (the quadratic merge took 5.6 s for 20 000, so some
// 50 s for these), in the order the merge gives. The bound is a hang
// check, far from both: the speed itself is BenchmarkAvroEncoderValue's.
func TestItemSchemaMergeLinear(t *testing.T) {
	const objects = 60000
	n, err := ParseJSON([]byte(distinctObjects(objects)))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s, err := InferSchema("payload", n)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d distinct objects inferred in %v", objects, took)
	if took > 15*time.Second {
		t.Errorf("%d distinct objects took %v to infer", objects, took)
	}
	items := s.Field("items").Items
	if len(items.Fields) != objects || !items.Required {
		t.Fatalf("merged %d fields (required %v), want %d (required)", len(items.Fields), items.Required, objects)
	}
	// The merge order sorts the schemas by their key: k0, k1, k10, k100, …
	if items.Fields[0].Name != "k0" || items.Fields[1].Name != "k1" || items.Fields[2].Name != "k10" {
		t.Errorf("merged fields begin %s %s %s", items.Fields[0].Name, items.Fields[1].Name, items.Fields[2].Name)
	}
}

// TestAvroValueOutputBounded: a payload of 240 KB whose Avro value would
// be 400 MB (20 000 objects, each written with 19 999 nulls) is refused,
// naming its size, without the memory of that value: the allocations made
// while handling it stay a few MiB.
func TestAvroValueOutputBounded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		fmt.Fprint(w, `{"id":1}`)
	}))
	defer srv.Close()
	const objects = 20000
	payload := []byte(distinctObjects(objects))
	for _, tc := range []struct {
		name      string
		maxSchema int   // the registry's MaxSchemaBytes
		want      error // the error's kind
		says      string
	}{
		{"value over its cap", 8 << 20, ErrTooLarge, "would be 400020005 bytes, more than the 1048576"},
		{"schema over its cap", 0, registry.ErrPayload, "more than the 1048576 bytes that walrelay sends"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := NewAvroEncoder(mustRegistry(t, registry.Config{URL: srv.URL, AutoRegister: true, MaxSchemaBytes: tc.maxSchema}))
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := e.Value(t.Context(), "t", Payload{Text: payload, Column: "payload", Expand: true, MaxBytes: 1 << 20})
			runtime.ReadMemStats(&after)
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d KB payload: %d KiB allocated: %v", len(payload)>>10, alloc>>10, err)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v, want %v saying %q", err, tc.want, tc.says)
			}
			if alloc > 48<<20 {
				t.Errorf("%d MiB allocated for a %d KB payload", alloc>>20, len(payload)>>10)
			}
		})
	}
}
