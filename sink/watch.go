package sink

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/sink/produce"
)

// watch runs until ctx ends: while a round has waited produce.WatchAfter or more, or
// a broker is fenced, it looks at the brokers every produce.WatchEvery (see produce.Fences).
func (s *Sink) watch(ctx context.Context) {
	t := time.NewTicker(produce.WatchEvery)
	defer t.Stop()
	w := produce.NewWatcher(s.fences, s.log, s.cfg.RequestTimeout, s.client, func() {
		s.client().ForceMetadataRefresh()
		if s.lanes != nil {
			s.lanes.each((*kgo.Client).ForceMetadataRefresh)
		}
	})
	var sweeping atomic.Bool
	swept := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.lanes != nil && time.Since(swept) >= laneSweep && sweeping.CompareAndSwap(false, true) {
			swept = time.Now()
			go func() {
				defer sweeping.Store(false)
				if err := s.sweepLanes(ctx); err != nil && ctx.Err() == nil {
					s.log.Debug("cannot look for brokers that left the cluster", "err", err)
				}
			}()
		}
		since := s.waiting.Load()
		if s.lanes != nil {
			since = s.lanes.oldestWait()
		}
		if (since == 0 || time.Since(time.Unix(0, since)) < produce.WatchAfter) && !s.fences.Fenced() {
			continue
		}
		w.Look(ctx, time.Now())
	}
}
