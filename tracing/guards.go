package tracing

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/walrelay/walrelay/event"
)

// unsampled reports whether traceparent is a W3C traceparent whose
// sampled flag is off, read in place: under a parent-based sampler such
// an event gets no span, and Publish returns before it allocates. Anything
// else (a traceparent that does not parse, none) is false, left to the
// propagator.
func unsampled(traceparent []byte) bool {
	if len(traceparent) < 55 || traceparent[2] != '-' || traceparent[35] != '-' || traceparent[52] != '-' ||
		len(traceparent) > 55 && traceparent[55] != '-' {
		return false
	}
	lo := traceparent[54]
	var flag byte
	switch {
	case lo >= '0' && lo <= '9':
		flag = lo - '0'
	case lo >= 'a' && lo <= 'f':
		flag = lo - 'a' + 10
	default:
		return false
	}
	return flag&1 == 0 && isHex(traceparent[53])
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }

// validText is s with any byte sequence that is not UTF-8 replaced (a
// table or topic name from a SQL_ASCII database, an error quoting one):
// protobuf refuses a string that is not UTF-8, and the OTLP exporter then
// fails the whole batch holding the span.
func validText(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// maxResent bounds the positions resent remembers.
const maxResent = 4096

// resent remembers the positions of the events whose publish failed: the
// relay resends them (the server streams them again from the confirmed
// position), and their WAL wait span was recorded by the first publish,
// which a second would cover again.
type resent struct {
	n  atomic.Int64 // len(m), read without the lock on the hot path
	mu sync.Mutex
	m  map[event.Position]struct{}
}

// add remembers p, unless maxResent positions are remembered already.
func (r *resent) add(p event.Position) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[event.Position]struct{}{}
	}
	if len(r.m) < maxResent {
		r.m[p] = struct{}{}
		r.n.Store(int64(len(r.m)))
	}
}

// take reports whether p was remembered, and forgets it.
func (r *resent) take(p event.Position) bool {
	if r.n.Load() == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.m[p]
	delete(r.m, p)
	r.n.Store(int64(len(r.m)))
	return ok
}
