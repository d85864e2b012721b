package schemafirst

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walrelay/walrelay/format/registry"
)

// subjectRegistry is a registry over loopback that answers GET
// /subjects/S/versions/latest with the Avro schema set for S (a 40401
// for a subject it lacks), counting the requests in all and by subject.
type subjectRegistry struct {
	url      string
	requests atomic.Int64
	mu       sync.Mutex
	schemas  map[string]string
	ids      map[string]int
	bySubj   map[string]int
}

func newSubjectRegistry(t *testing.T) *subjectRegistry {
	t.Helper()
	ss := &subjectRegistry{schemas: map[string]string{}, ids: map[string]int{}, bySubj: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ss.requests.Add(1)
		subject, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/subjects/"), "/versions/latest")
		ss.mu.Lock()
		ss.bySubj[subject]++
		schema, known := ss.schemas[subject]
		id := ss.ids[subject]
		ss.mu.Unlock()
		if !ok || !known {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error_code": 40401, "message": "Subject not found"}`))
			return
		}
		b, _ := json.Marshal(map[string]any{"subject": subject, "version": 1, "id": id, "schema": schema})
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	ss.url = srv.URL
	return ss
}

// register makes schema subject's latest, of id id.
func (ss *subjectRegistry) register(subject string, id int, schema string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.schemas[subject], ss.ids[subject] = schema, id
}

// of is the requests for subject so far.
func (ss *subjectRegistry) of(subject string) int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.bySubj[subject]
}

// TestSchemaFirstUnusableReadBounded (a registry over loopback counting
// its requests): events of a subject the registry lacks, or whose schema
// does not compile, ask the registry once per UnusableReadInterval,
// whatever their number; the events in between get the same error
// (ErrNotRegistered, dead-lettered as before) without a request. Each
// event used to ask again (and compile again).
func TestSchemaFirstUnusableReadBounded(t *testing.T) {
	t.Parallel()
	const interval = 10 * time.Second
	for _, tc := range []struct {
		name, subject, schema string
	}{
		{"a subject the registry lacks", "Missing", ""},
		{"a schema that does not compile", "Broken", `{"type":"record","name":"Broken","fields":[{"name":"x","type":"nosuchtype"}]}`},
		{"a JSON schema under the Avro format", "Other", `{"type":"object"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ss := newSubjectRegistry(t)
			if tc.schema != "" {
				ss.register(tc.subject, 7, tc.schema)
			}
			enc := schemaFirst(t, ss.url, Config{Kind: KindAvro, UnusableReadInterval: interval})
			var clock atomic.Int64
			start := time.Now()
			enc.now = func() time.Time { return start.Add(time.Duration(clock.Load())) }
			const n = 300
			for i := range n {
				_, err := enc.Value(t.Context(), "orders", tc.subject, []byte(`{"x": 1}`), 0)
				if !errors.Is(err, registry.ErrNotRegistered) {
					t.Fatalf("event %d: %v, want ErrNotRegistered", i, err)
				}
			}
			if got := ss.of(tc.subject); got != 1 {
				t.Fatalf("%d events within the interval: %d requests, want 1", n, got)
			}
			clock.Add(int64(interval))
			for range n {
				if _, err := enc.Value(t.Context(), "orders", tc.subject, []byte(`{"x": 1}`), 0); !errors.Is(err, registry.ErrNotRegistered) {
					t.Fatalf("once the interval passed: %v, want ErrNotRegistered", err)
				}
			}
			if got := ss.of(tc.subject); got != 2 {
				t.Fatalf("%d more events once the interval passed: %d requests in all, want 2", n, got)
			}
			// Registered (or mended) meanwhile: used once the interval passes.
			ss.register(tc.subject, 8, `{"type":"record","name":"R","fields":[{"name":"x","type":"long"}]}`)
			clock.Add(int64(interval))
			out, err := enc.Value(t.Context(), "orders", tc.subject, []byte(`{"x": 1}`), 0)
			if id, _, _ := registry.Unframe(out); err != nil || id != 8 {
				t.Fatalf("the subject registered, the interval passed: id %d, %v; want id 8", id, err)
			}
		})
	}
}
