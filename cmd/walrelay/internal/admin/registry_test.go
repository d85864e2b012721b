package admin

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRegistryStatus: no registry format, no status; requests that get an
// answer say answering; a failure after them says not answering, why and
// since when, until the next answer; the requests are counted by outcome.
func TestRegistryStatus(t *testing.T) {
	m := New()
	if st := m.registryStatus(); st != nil {
		t.Fatalf("no registry format: %+v", st)
	}
	m.UseRegistry()
	if st := m.registryStatus(); st == nil || !st.Answering {
		t.Fatalf("before any request: %+v", st)
	}
	m.RegistryRequest(nil)
	m.RegistryRequest(errors.New("dial tcp 127.0.0.1:1: connect: connection refused"))
	m.RegistryRequest(errors.New("HTTP 503 from http://r/schemas/ids/1"))
	st := m.registryStatus()
	if st.Answering || !strings.Contains(st.Problem, "HTTP 503") || st.Since == "" {
		t.Fatalf("after failures: %+v", st)
	}
	m.RegistryRequest(nil)
	if st := m.registryStatus(); !st.Answering || st.Problem != "" {
		t.Fatalf("answering again: %+v", st)
	}
	if ok, bad := testutil.ToFloat64(m.registry.requests.WithLabelValues("ok")), testutil.ToFloat64(m.registry.requests.WithLabelValues("error")); ok != 2 || bad != 2 {
		t.Errorf("requests: ok %v, error %v, want 2 and 2", ok, bad)
	}
}
