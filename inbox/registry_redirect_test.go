package inbox

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/walrelay/walrelay/format/registry"
)

// TestRegistryRedirectRefused: a registry that redirects the consumer's
// request for a schema, to another port of its host, is not followed: the
// other server gets no request (neither the consumer's password nor the
// chance to give it a schema), and the record is held as of a wrong URL
// (ErrRegistryUnavailable), the error naming the redirect.
func TestRegistryRedirectRefused(t *testing.T) {
	t.Parallel()
	var reached atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reached.Add(1)
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		_, _ = w.Write([]byte(`{"schema":"\"bytes\""}`))
	}))
	t.Cleanup(target.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusFound)
	}))
	t.Cleanup(srv.Close)
	reg, err := NewRegistry(RegistryConfig{URL: srv.URL, Username: "consumer", Password: "pw-secret"})
	if err != nil {
		t.Fatal(err)
	}
	var v any
	err = reg.Decode(t.Context(), registry.Frame(nil, 9, []byte{2, 'x'}), &v)
	if n := reached.Load(); n != 0 {
		t.Errorf("the server the registry redirected to got %d requests; decoded %v, err %v", n, v, err)
	}
	if !errors.Is(err, ErrRegistryUnavailable) || !errors.Is(err, registry.ErrNotSchemaRegistry) || errors.Is(err, ErrUndecodable) ||
		err == nil || !strings.Contains(err.Error(), "does not follow") || strings.Contains(err.Error(), "pw-secret") {
		t.Errorf("a redirect: %v, want ErrRegistryUnavailable (a wrong URL) saying walrelay does not follow it, without the password", err)
	}
}
