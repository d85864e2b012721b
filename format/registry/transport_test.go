package registry

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// TestRegistryOnRequest: each request is reported, an answer (a 404 with
// Confluent's error code included) as nil, a 404 without it (a path that
// is not the API), a 5xx and a refused connection as an error that names
// neither user nor password.
func TestRegistryOnRequest(t *testing.T) {
	status, code := http.StatusOK, 40403
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(status)
		_, _ = fmt.Fprintf(w, `{"schema":"\"string\"","error_code":%d,"message":"m"}`, code)
	}))
	reg := mustRegistry(t, Config{URL: srv.URL, Username: "relay", Password: "pw-secret"})
	var mu sync.Mutex
	var got []error
	reg.OnRequest(func(err error) { mu.Lock(); got = append(got, err); mu.Unlock() })
	ctx := t.Context()
	_, _ = reg.SchemaByID(ctx, 1)
	status = http.StatusNotFound
	_, _ = reg.SchemaByID(ctx, 2)
	code = 404
	_, _ = reg.SchemaByID(ctx, 5)
	status = http.StatusBadGateway
	_, _ = reg.SchemaByID(ctx, 3)
	srv.Close()
	_, _ = reg.SchemaByID(ctx, 4)
	mu.Lock()
	defer mu.Unlock()
	if len(got) < 5 || got[0] != nil || got[1] != nil || !NotSchemaRegistry(got[2]) || got[3] == nil || NotSchemaRegistry(got[3]) || got[len(got)-1] == nil {
		t.Fatalf("reported %v, want nil, nil, a wrong path, then errors", got)
	}
	for _, err := range got[2:] {
		if strings.Contains(err.Error(), "pw-secret") || strings.Contains(err.Error(), "relay") {
			t.Errorf("the error names the credentials: %v", err)
		}
	}
}
