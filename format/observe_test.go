package format

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// TestRegistryOnRequest: each request is reported, an answer (a 404
// included) as nil, a 5xx and a refused connection as an error that names
// neither user nor password.
func TestRegistryOnRequest(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"schema":"\"string\"","error_code":1,"message":"m"}`))
	}))
	reg := mustRegistry(t, RegistryConfig{URL: srv.URL, Username: "relay", Password: "pw-secret"})
	var mu sync.Mutex
	var got []error
	reg.OnRequest(func(err error) { mu.Lock(); got = append(got, err); mu.Unlock() })
	ctx := t.Context()
	_, _ = reg.SchemaByID(ctx, 1)
	status = http.StatusNotFound
	_, _ = reg.SchemaByID(ctx, 2)
	status = http.StatusBadGateway
	_, _ = reg.SchemaByID(ctx, 3)
	srv.Close()
	_, _ = reg.SchemaByID(ctx, 4)
	mu.Lock()
	defer mu.Unlock()
	if len(got) < 4 || got[0] != nil || got[1] != nil || got[2] == nil || got[len(got)-1] == nil {
		t.Fatalf("reported %v, want nil, nil, then errors", got)
	}
	for _, err := range got[2:] {
		if strings.Contains(err.Error(), "pw-secret") || strings.Contains(err.Error(), "relay") {
			t.Errorf("the error names the credentials: %v", err)
		}
	}
}
