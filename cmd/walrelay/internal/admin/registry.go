package admin

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/walrelay/walrelay/format/registry"
)

// RegistryStatus is whether the schema registry of the registry formats
// answers, and if not, why walrelay takes it to be down and since when.
type RegistryStatus struct {
	Answering bool   `json:"answering"`
	Problem   string `json:"problem,omitempty"`
	Since     string `json:"since,omitempty"` // RFC 3339
	// WrongURL: the registry's last failure was an answer that is not
	// Confluent's Schema Registry API (a 404 without its error code, a
	// web page): a configuration problem (kafka.schema_registry.url),
	// held as an outage.
	WrongURL bool `json:"wrong_url,omitempty"`
}

// registryState is what the schema registry's last answers say.
type registryState struct {
	used     atomic.Bool  // a registry format is configured (RegistryRequest was wired)
	ok, fail atomic.Int64 // unix nanoseconds of the last answer, the last failure
	downAt   atomic.Int64 // unix nanoseconds of the first failure after an answer
	err      atomic.Value // string: the last failure
	wrong    atomic.Bool  // the last failure is a URL that is not the API (registry.NotSchemaRegistry)
	requests *prometheus.CounterVec
}

func newRegistryState(reg *prometheus.Registry) *registryState {
	s := &registryState{requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_schema_registry_requests_total",
		Help: "Requests to the schema registry of the registry formats, by outcome (ok: it answered, a refusal included; error: no answer, a timeout or a 5xx)."}, []string{"outcome"})}
	reg.MustRegister(s.requests)
	return s
}

// UseRegistry says that a registry format is configured: status shows the
// registry from then on.
func (m *Metrics) UseRegistry() { m.registry.used.Store(true) }

// RegistryRequest counts a request to the schema registry: err nil if it
// answered, else why not (registry.Client.OnRequest). The error holds no
// secret (basic auth is a header, never in it).
func (m *Metrics) RegistryRequest(err error) {
	s := m.registry
	s.used.Store(true)
	now := time.Now().UnixNano()
	if err == nil {
		s.requests.WithLabelValues("ok").Inc()
		s.ok.Store(now)
		s.downAt.Store(0)
		return
	}
	s.requests.WithLabelValues("error").Inc()
	s.err.Store(err.Error())
	s.wrong.Store(registry.NotSchemaRegistry(err))
	s.fail.Store(now)
	s.downAt.CompareAndSwap(0, now)
}

// registryProblem is "" while the registry answers (or none is used),
// else why walrelay takes it to be down (no answer, a 5xx, an answer
// that is not Confluent's API: wrong), with since when.
func (m *Metrics) registryProblem() (problem string, wrong bool, since time.Time) {
	s := m.registry
	if s.fail.Load() <= s.ok.Load() {
		return "", false, time.Time{}
	}
	msg, _ := s.err.Load().(string)
	if msg == "" {
		msg = "no answer"
	}
	return msg, s.wrong.Load(), time.Unix(0, s.downAt.Load())
}

// registryStatus is the status's view of the registry, nil without one.
func (m *Metrics) registryStatus() *RegistryStatus {
	if !m.registry.used.Load() {
		return nil
	}
	problem, wrong, since := m.registryProblem()
	st := &RegistryStatus{Answering: problem == "", Problem: problem, WrongURL: wrong}
	if problem != "" {
		st.Since = since.UTC().Format(time.RFC3339)
	}
	return st
}
