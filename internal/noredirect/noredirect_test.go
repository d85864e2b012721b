package noredirect

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestClientNamesTheRedirectWithoutSecrets: Client's error for each
// redirect status names the URL that answered and the Location resolved
// against it, without userinfo, query or fragment, cut when long; any
// other status is answered as is.
func TestClientNamesTheRedirectWithoutSecrets(t *testing.T) {
	t.Parallel()
	long := "/" + strings.Repeat("a", 1000)
	for _, tc := range []struct {
		name, location, want string
		status               int
	}{
		{"relative, with query and fragment", "/next?token=tok-secret#frag-secret", "/next", http.StatusMovedPermanently},
		{"absolute, with userinfo", "http://user:pw-secret@other.example:81/p?token=tok-secret", "http://other.example:81/p", http.StatusSeeOther},
		{"long", long, long[:maxPrinted-30], http.StatusTemporaryRedirect},
		{"none", "", "no Location", http.StatusFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/start" {
					t.Errorf("followed to %s", r.URL)
				}
				if tc.location != "" {
					w.Header().Set("Location", tc.location)
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte("REDIRECT-BODY"))
			}))
			t.Cleanup(srv.Close)
			resp, err := Client(nil, 0).Get(srv.URL + "/start?q=start-secret")
			if err == nil {
				resp.Body.Close()
				t.Fatalf("HTTP %d answered, want an error", resp.StatusCode)
			}
			var e *Error
			if !errors.As(err, &e) || e.Status != tc.status || e.URL != srv.URL+"/start" {
				t.Fatalf("%v: want an *Error of HTTP %d from %s/start", err, tc.status, srv.URL)
			}
			if !strings.Contains(e.Error(), tc.want) || len(e.Error()) > 2*maxPrinted+100 {
				t.Errorf("%q, want it to name %q, bounded", e.Error(), tc.want)
			}
			for _, s := range []string{"secret", "REDIRECT-BODY"} {
				if strings.Contains(e.Error(), s) {
					t.Errorf("%q prints %s", e.Error(), s)
				}
			}
		})
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNotModified)
	}))
	t.Cleanup(srv.Close)
	resp, err := Client(nil, 0).Get(srv.URL)
	if err != nil || resp.StatusCode != http.StatusNotModified {
		t.Fatalf("304: %v, want the answer", err)
	}
	resp.Body.Close()
}
