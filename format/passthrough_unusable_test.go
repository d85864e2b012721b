package format

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walrelay/walrelay/format/registry"
)

// TestPassthroughUnknownIDReadBounded (a registry over loopback counting
// its requests): values framing a schema id the registry lacks ask the
// registry once per UnusableReadInterval, whatever their number (the
// application chooses the ids it frames); the values in between are
// ErrSchemaUnknown, as the first, without a request. Each value used to
// ask again.
func TestPassthroughUnknownIDReadBounded(t *testing.T) {
	t.Parallel()
	const interval = 10 * time.Second
	var requests, known atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		if known.Load() == 0 {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error_code":40403,"message":"Schema not found"}`))
			return
		}
		if strings.HasSuffix(r.URL.Path, "/versions") {
			_, _ = w.Write([]byte(`[{"subject":"orders-value","version":1}]`))
			return
		}
		_, _ = w.Write([]byte(`{"schema":"\"string\""}`))
	}))
	t.Cleanup(srv.Close)
	p := mustPassthrough(t, mustRegistry(t, registry.Config{URL: srv.URL}), PassthroughConfig{UnusableReadInterval: interval})
	var clock atomic.Int64
	start := time.Now()
	p.now = func() time.Time { return start.Add(time.Duration(clock.Load())) }
	framed := registry.Frame(nil, 77, []byte{2, 'a'})
	const n = 300
	check := func() {
		t.Helper()
		for i := range n {
			if err := p.Check(t.Context(), "orders", "", framed); !errors.Is(err, registry.ErrSchemaUnknown) {
				t.Fatalf("value %d: %v, want ErrSchemaUnknown", i, err)
			}
		}
	}
	check()
	if got := requests.Load(); got != 1 {
		t.Fatalf("%d values within the interval: %d requests, want 1", n, got)
	}
	clock.Add(int64(interval))
	check()
	if got := requests.Load(); got != 2 {
		t.Fatalf("%d more values once the interval passed: %d requests in all, want 2", n, got)
	}
	known.Store(1)
	clock.Add(int64(interval))
	if err := p.Check(t.Context(), "orders", "", framed); err != nil {
		t.Fatalf("the id registered, the interval passed: %v", err)
	}
}

// TestPassthroughForeignIDReadBounded (a registry over loopback counting
// its requests): values framing a schema id the registry has, but under
// another subject than the value's, ask the registry once per
// UnusableReadInterval, whatever their number; the values in between are
// ErrSchemaUnknown without a request. Once the value's subject takes the
// id and the interval has passed, they are published. Before, each value
// asked twice (the schema, then its versions: 300 values, 600 requests).
func TestPassthroughForeignIDReadBounded(t *testing.T) {
	t.Parallel()
	const interval = 10 * time.Second
	var requests, ours atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		if strings.HasSuffix(r.URL.Path, "/versions") {
			if ours.Load() == 0 {
				_, _ = w.Write([]byte(`[{"subject":"payments-value","version":1}]`))
			} else {
				_, _ = w.Write([]byte(`[{"subject":"payments-value","version":1},{"subject":"orders-value","version":1}]`))
			}
			return
		}
		_, _ = w.Write([]byte(`{"schema":"\"string\""}`))
	}))
	t.Cleanup(srv.Close)
	p := mustPassthrough(t, mustRegistry(t, registry.Config{URL: srv.URL}), PassthroughConfig{UnusableReadInterval: interval})
	var clock atomic.Int64
	start := time.Now()
	p.now = func() time.Time { return start.Add(time.Duration(clock.Load())) }
	framed := registry.Frame(nil, 77, []byte{2, 'a'})
	var first int64
	for i := range 300 {
		if err := p.Check(t.Context(), "orders", "", framed); !errors.Is(err, registry.ErrSchemaUnknown) {
			t.Fatalf("value %d: %v, want ErrSchemaUnknown", i, err)
		}
		if i == 0 {
			first = requests.Load()
		}
	}
	if got := requests.Load(); got != first {
		t.Fatalf("300 values of an id of another subject within the interval: %d requests, want the first value's %d alone", got, first)
	}
	if err := p.Check(t.Context(), "payments", "", framed); err != nil {
		t.Fatalf("the id to its own subject's topic: %v", err)
	}
	ours.Store(1)
	clock.Add(int64(interval))
	if err := p.Check(t.Context(), "orders", "", framed); err != nil {
		t.Fatalf("the id registered under orders-value too, the interval passed: %v", err)
	}
}
