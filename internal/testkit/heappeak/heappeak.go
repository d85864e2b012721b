// Package heappeak measures the live heap a piece of code needs, for the
// tests of memory bounds (decoded values, compiled schemas, written
// values): the one sampler they share.
package heappeak

import (
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// Of runs f and returns the most live heap objects' bytes seen while it
// ran, above what there was before it (sampled every millisecond with
// runtime/metrics, which does not stop the world).
func Of(f func()) uint64 {
	runtime.GC()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() uint64 { metrics.Read(sample); return sample[0].Value.Uint64() }
	base := read()
	var peak atomic.Uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			if v := read(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	f()
	if v := read(); v > peak.Load() {
		peak.Store(v)
	}
	close(stop)
	<-done
	if peak.Load() < base {
		return 0
	}
	return peak.Load() - base
}
