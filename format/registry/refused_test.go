package registry

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestRegistryRefusedShapeAskedOncePerInterval: under the avro format, a
// payload whose inferred schema the registry refuses (not registered with
// auto_register off; incompatible, 409, with it on) is asked about once
// per UnusableReadInterval, whatever the rows: the rows in between get
// the same error without a request; after the interval one more request.
// An outage (500) is never remembered. Before, every row made a request
// (a writer's rows of one refused shape: 300 rows, 300 requests).
func TestRegistryRefusedShapeAskedOncePerInterval(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		auto   bool
		status int
		code   int
		want   error
	}{
		{"not registered, auto_register off", false, http.StatusNotFound, 40403, ErrNotRegistered},
		{"incompatible, auto_register on", true, http.StatusConflict, 409, ErrRefused},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var calls, status atomic.Int64
			status.Store(int64(c.status))
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
				s := int(status.Load())
				w.WriteHeader(s)
				if s == http.StatusOK {
					_, _ = w.Write([]byte(`{"id":7,"subject":"t-value","version":1,"schema":"\"long\""}`))
					return
				}
				code := c.code
				if s == http.StatusInternalServerError {
					code = 50001
				}
				_, _ = fmt.Fprintf(w, `{"error_code":%d,"message":"no"}`, code)
			}))
			defer srv.Close()
			reg := mustRegistry(t, Config{URL: srv.URL, AutoRegister: c.auto})
			clock := time.Unix(1_000_000, 0)
			reg.now = func() time.Time { return clock }
			var first int64 // the first row's requests (a 409 to a registration is looked up, and tried again)
			for i := range 300 {
				if _, err := reg.ID(t.Context(), "t-value", `"long"`); !errors.Is(err, c.want) {
					t.Fatalf("row %d: %v, want %v", i, err, c.want)
				}
				if i == 0 {
					first = calls.Load()
				}
			}
			if n := calls.Load(); n != first {
				t.Fatalf("300 rows of a refused shape within the interval: %d requests, want the first row's %d alone", n, first)
			}
			clock = clock.Add(DefaultUnusableReadInterval)
			status.Store(http.StatusOK)
			if id, err := reg.ID(t.Context(), "t-value", `"long"`); err != nil || id != 7 {
				t.Fatalf("after the interval, the shape registered meanwhile: id %d, %v", id, err)
			}
			if n := calls.Load(); n != first+1 {
				t.Fatalf("after the interval: %d requests in all, want %d", n, first+1)
			}
			// An outage is never remembered: each row asks again.
			status.Store(http.StatusInternalServerError)
			for range 3 {
				if _, err := reg.ID(t.Context(), "t-value", `"double"`); err == nil || !Outage(err) {
					t.Fatalf("500: %v, want an outage", err)
				}
			}
			if n := calls.Load(); n < first+4 {
				t.Fatalf("3 rows during an outage: %d requests in all, want each asked (at least %d)", n, first+4)
			}
		})
	}
}
