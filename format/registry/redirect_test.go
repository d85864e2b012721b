package registry

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
)

// TestRegistryRefusesRedirects: a registry that answers with a redirect
// (to another host, to another port of its host, from https to http on its
// host) is not followed: the server it points at gets no request, so
// neither the basic auth nor the schema, and cannot choose the id. The
// error says that the registry's URL answered with a redirect that
// walrelay does not follow, names where to without the Location's userinfo
// or query, and quotes no body (the redirect's is not the registry's
// answer).
func TestRegistryRefusesRedirects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		https      bool   // the registry serves https
		targetHost string // the host of the Location
		status     int
		userinfo   bool // the Location carries user:password@
	}{
		{"another host", false, "localhost", http.StatusTemporaryRedirect, true},
		{"another port of the same host", false, "127.0.0.1", http.StatusFound, false},
		{"https to http on the same host", true, "127.0.0.1", http.StatusPermanentRedirect, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var reached, withPassword atomic.Int32
			target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				reached.Add(1)
				if _, p, ok := r.BasicAuth(); ok && p == "pw-secret" {
					withPassword.Add(1)
				}
				w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
				_, _ = w.Write([]byte(`{"id":666,"message":"TARGET-BODY"}`))
			}))
			t.Cleanup(target.Close)
			tu, _ := url.Parse(target.URL)
			loc := "http://" + tc.targetHost + ":" + tu.Port() + "/elsewhere"
			if tc.userinfo {
				loc = "http://leak:pw-in-location@" + tc.targetHost + ":" + tu.Port() + "/elsewhere"
			}
			redirect := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", loc+"?token=tok-secret")
				w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(`{"error_code":50001,"message":"REDIRECT-BODY"}`))
			})
			cfg := Config{Username: "relay", Password: "pw-secret", AutoRegister: true}
			var srv *httptest.Server
			if tc.https {
				srv = httptest.NewTLSServer(redirect)
				cfg.TLS = &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
			} else {
				srv = httptest.NewServer(redirect)
			}
			t.Cleanup(srv.Close)
			cfg.URL = srv.URL
			reg := mustRegistry(t, cfg)
			var observedErr atomic.Pointer[error]
			reg.OnRequest(func(err error) { observedErr.Store(&err) })
			id, err := reg.ID(t.Context(), "t-value", `"string"`)
			if n := reached.Load(); n != 0 {
				t.Errorf("the server the registry redirected to got %d requests (%d with the registry's password); id %d, err %v", n, withPassword.Load(), id, err)
			}
			if err == nil {
				t.Fatalf("a redirect: id %d, no error", id)
			}
			msg := err.Error()
			t.Logf("error: %s", msg)
			want := "http://" + tc.targetHost + ":" + tu.Port() + "/elsewhere"
			if !strings.Contains(msg, "redirect") || !strings.Contains(msg, "does not follow") || !strings.Contains(msg, want) {
				t.Errorf("error %q, want it to say the registry answered with a redirect to %s that walrelay does not follow", msg, want)
			}
			for _, secret := range []string{"pw-secret", "pw-in-location", "tok-secret", "REDIRECT-BODY", "TARGET-BODY"} {
				if strings.Contains(msg, secret) {
					t.Errorf("error %q prints %s", msg, secret)
				}
			}
			if !NotSchemaRegistry(err) || !Outage(err) {
				t.Errorf("error %q: want a wrong URL (ErrNotSchemaRegistry) held as an outage", msg)
			}
			if p := observedErr.Load(); p == nil || !NotSchemaRegistry(*p) || !strings.Contains((*p).Error(), "does not follow") {
				t.Errorf("OnRequest's error: %v, want the redirect as a wrong URL", p)
			}
		})
	}
}
