package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestStatusRefusesRedirect: an admin address whose server answers
// `walrelay status` (and `status --ready`) with a redirect, to another
// server that answers as a walrelay would, is not followed: the other
// server gets no request, status fails saying that the admin address
// answered with a redirect that walrelay does not follow (without the
// Location's query), and prints nothing of the other server's answer as
// the instance's.
func TestStatusRefusesRedirect(t *testing.T) {
	t.Parallel()
	var reached atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"state":"OTHER-SERVER-STATE","waiting_for":"","error":"OTHER-SERVER"}`))
	}))
	t.Cleanup(other.Close)
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", other.URL+r.URL.Path+"?token=tok-secret")
		w.WriteHeader(http.StatusFound)
		_, _ = w.Write([]byte("REDIRECT-BODY"))
	}))
	t.Cleanup(admin.Close)
	addr := strings.TrimPrefix(admin.URL, "http://")
	for _, args := range [][]string{{"status"}, {"status", "--ready"}} {
		code, out := runCmd(t, env{"WALRELAY_ADMIN_LISTEN": addr}, args...)
		cmd := strings.Join(args, " ")
		t.Logf("walrelay %s: exit %d: %s", cmd, code, out)
		if code == 0 || !strings.Contains(out, "redirect") || !strings.Contains(out, "does not follow") || !strings.Contains(out, addr) {
			t.Errorf("walrelay %s: exit %d, want a failure saying the admin address %s answered with a redirect walrelay does not follow:\n%s", cmd, code, addr, out)
		}
		for _, s := range []string{"OTHER-SERVER", "tok-secret", "REDIRECT-BODY", "no walrelay answers"} {
			if strings.Contains(out, s) {
				t.Errorf("walrelay %s prints %q:\n%s", cmd, s, out)
			}
		}
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("the server the admin address redirected to got %d requests", n)
	}
}
