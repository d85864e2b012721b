package admin

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/walrelay/walrelay/format/registry"
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

// TestRegistryStatusWrongURL: a failure that is an answer of something
// else than Confluent's API (registry.ErrNotSchemaRegistry) is shown as a
// wrong URL, a configuration problem, not as a registry that does not
// answer; an outage after it is an outage again.
func TestRegistryStatusWrongURL(t *testing.T) {
	m := New()
	m.UseRegistry()
	m.RegistryRequest(nil)
	m.RegistryRequest(fmt.Errorf("%w: HTTP 404 from http://r/subjects without Confluent's error code", registry.ErrNotSchemaRegistry))
	st := m.registryStatus()
	if st.Answering || !st.WrongURL || !strings.Contains(st.Problem, "/apis/ccompat/v7") || strings.Contains(st.Problem, "no answer") {
		t.Fatalf("after a 404 without Confluent's error code: %+v", st)
	}
	m.RegistryRequest(errors.New("no answer: HTTP 503 from http://r/subjects"))
	if st := m.registryStatus(); st.Answering || st.WrongURL {
		t.Fatalf("an outage after it: %+v", st)
	}
}
