package inbox

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/walrelay/walrelay/format/registry"
)

// TestRegistryWrongURLRetried: a registry URL that misses Confluent's API
// answers 404 without its error code (Apicurio's base URL: error_code
// 404; a web server: an HTML page): the record is retried as in an
// outage (ErrRegistryUnavailable, naming the wrong URL), not dead-lettered
// as of an unknown id.
func TestRegistryWrongURLRetried(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{"error_code":404,"message":"RESTEASY003210: Could not find resource"}`, `<html><body>Not Found</body></html>`} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(body))
		}))
		reg, err := NewRegistry(RegistryConfig{URL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		var v any
		err = reg.Decode(t.Context(), registry.Frame(nil, 9, []byte{0}), &v)
		if !errors.Is(err, ErrRegistryUnavailable) || !errors.Is(err, registry.ErrNotSchemaRegistry) || errors.Is(err, ErrUndecodable) {
			t.Errorf("404 %s: %v, want ErrRegistryUnavailable (a wrong URL)", body, err)
		}
		srv.Close()
	}
}
