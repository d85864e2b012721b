package registry

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRegistryBasicAuthAndErrors: the registry's user and password go in
// HTTP basic auth, never in an error; a 409 (incompatible) and a 422
// (invalid) are ErrRefused, a 404 with Confluent's error code
// ErrNotRegistered (without it: a wrong URL, an outage), a 401
// ErrUnauthorized, a 5xx an outage (none of them), the id cached after the
// first answer.
func TestRegistryBasicAuthAndErrors(t *testing.T) {
	status, calls, noCode := http.StatusOK, 0, false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if u, p, ok := r.BasicAuth(); !ok || u != "relay" || p != "pw-secret" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error_code":401,"message":"Unauthorized"}`))
			return
		}
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		w.WriteHeader(status)
		if status == http.StatusOK {
			_, _ = w.Write([]byte(`{"id":7}`))
			return
		}
		code := status * 100
		if status == http.StatusNotFound && !noCode {
			code = 40401 // subject not found
		}
		_, _ = fmt.Fprintf(w, `{"error_code":%d,"message":"no"}`, code)
	}))
	defer srv.Close()
	ctx := t.Context()
	reg := mustRegistry(t, Config{URL: srv.URL, Username: "relay", Password: "pw-secret", AutoRegister: true})
	if id, err := reg.ID(ctx, "t-value", `"string"`); err != nil || id != 7 {
		t.Fatalf("id %d, %v", id, err)
	}
	if id, err := reg.ID(ctx, "t-value", `"string"`); err != nil || id != 7 || calls != 1 {
		t.Fatalf("cached: id %d, %v, %d calls", id, err, calls)
	}
	for code, want := range map[int]error{http.StatusConflict: ErrRefused, http.StatusUnprocessableEntity: ErrRefused, http.StatusNotFound: ErrNotRegistered, http.StatusInternalServerError: nil} {
		status = code
		// A schema of its own for each answer: a refused one is not asked
		// about again within Config.UnusableReadInterval.
		_, err := reg.ID(ctx, "t-value", fmt.Sprintf(`{"type":"string","doc":"%d"}`, code))
		switch {
		case err == nil:
			t.Errorf("%d: no error", code)
		case want != nil && !errors.Is(err, want):
			t.Errorf("%d: %v, want %v", code, err, want)
		case want == nil && (errors.Is(err, ErrRefused) || errors.Is(err, ErrNotRegistered)):
			t.Errorf("%d: %v, want an outage", code, err)
		}
	}
	status, noCode = http.StatusNotFound, true
	if _, err := reg.ID(ctx, "t-value", `"long"`); !errors.Is(err, ErrNotSchemaRegistry) || !Outage(err) {
		t.Errorf("404 without Confluent's error code: %v, want a wrong URL held as an outage", err)
	}
	status = http.StatusOK
	wrong := mustRegistry(t, Config{URL: srv.URL, Username: "relay", Password: "pw-wrong", AutoRegister: true})
	_, err := wrong.ID(ctx, "t-value", `"long"`)
	if !errors.Is(err, ErrUnauthorized) || strings.Contains(err.Error(), "pw-wrong") {
		t.Errorf("wrong password: %v, want ErrUnauthorized, without the password", err)
	}
}
