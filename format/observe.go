package format

import (
	"fmt"
	"net/http"
	"sync/atomic"
)

// observed is a registry's HTTP transport that reports the outcome of each
// request to the function set with Registry.OnRequest.
type observed struct {
	base http.RoundTripper
	f    atomic.Pointer[func(error)]
}

// RoundTrip implements http.RoundTripper: a request that gets no answer,
// or a 5xx, is a failure of the registry (an outage); any other answer,
// a 4xx included, is the registry answering.
func (o *observed) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := o.base.RoundTrip(req)
	if f := o.f.Load(); f != nil {
		switch {
		case err != nil:
			(*f)(err)
		case resp.StatusCode >= 500:
			(*f)(fmt.Errorf("HTTP %d from %s", resp.StatusCode, req.URL.Redacted()))
		default:
			(*f)(nil)
		}
	}
	return resp, err
}

// OnRequest has f called after each request to the registry: with nil if
// it answered (a 4xx included), with the error if it did not answer or
// answered 5xx. For metrics and status; f must be fast and safe for
// concurrent use. Passwords are in no error (basic auth is a header).
func (r *Registry) OnRequest(f func(err error)) {
	if r.obs != nil {
		r.obs.f.Store(&f)
	}
}

// Registry is the encoder's schema registry.
func (e *AvroEncoder) Registry() *Registry { return e.reg }

// Registry is the checker's schema registry.
func (p *Passthrough) Registry() *Registry { return p.reg }

// Registry is the schema-first encoder's schema registry.
func (s *SchemaFirst) Registry() *Registry { return s.reg }
