package sink

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

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
			s.lanes.Each((*kgo.Client).ForceMetadataRefresh)
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
			since = s.lanes.OldestWait()
		}
		if (since == 0 || time.Since(time.Unix(0, since)) < produce.WatchAfter) && !s.fences.Fenced() {
			continue
		}
		w.Look(ctx, time.Now())
	}
}

// laneSweep is how often the sink asks the cluster for its brokers, to
// close the lanes of those that left it (produce.Lanes.Retire).
const laneSweep = 30 * time.Second

// sweepLanes asks a broker for the cluster's brokers and retires the lanes
// of those it does not list.
func (s *Sink) sweepLanes(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = []kmsg.MetadataRequestTopic{}
	resp, err := req.RequestWith(ctx, s.client())
	if err != nil {
		return fmt.Errorf("ask for the cluster's brokers: %w", err)
	}
	listed := map[int32]string{}
	for _, b := range resp.Brokers {
		listed[b.NodeID] = net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
	}
	if len(listed) > 0 {
		s.lanes.Retire(listed)
	}
	return nil
}
