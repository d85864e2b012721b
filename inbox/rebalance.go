package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func (c *Consumer) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, parts := range assigned {
		for _, p := range parts {
			tp := topicPartition{topic, p}
			if c.workers[tp] != nil {
				continue
			}
			w := newWorker(c, cl, tp)
			c.workers[tp] = w
			go w.run()
		}
	}
	c.log.Info("partitions assigned", "partitions", fmt.Sprint(assigned))
}

// revoked lets the revoked partitions' workers finish their batches, then
// commits their offsets before the partitions go to another member.
func (c *Consumer) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	c.stopWorkers(revoked, false)
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		c.log.Warn("commit offsets of revoked partitions; their new owner skips the records the inbox holds", "err", err)
	}
	c.log.Info("partitions revoked", "partitions", fmt.Sprint(revoked))
}

// lost stops the lost partitions' workers at once: another member may
// handle them already (the inbox keeps each event once).
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.stopWorkers(lost, true)
	c.log.Warn("partitions lost", "partitions", fmt.Sprint(lost))
}

// stopWorkers stops the workers of parts (all when nil) and waits for
// them: after their current batch, or at once when abort is set. It waits
// ShutdownTimeout at most, then cancels the batches' handlers (their
// transactions roll back) and waits for them min(ShutdownTimeout, 2s)
// more; a worker still running then (its handler ignores its context) is
// abandoned (worker.abandon), so a stop or a rebalance never waits longer.
func (c *Consumer) stopWorkers(parts map[string][]int32, abort bool) {
	c.mu.Lock()
	var ws []*worker
	for tp, w := range c.workers {
		if parts != nil && !contains(parts[tp.topic], tp.partition) {
			continue
		}
		ws = append(ws, w)
		delete(c.workers, tp)
	}
	c.mu.Unlock()
	for _, w := range ws {
		w.stop(abort)
	}
	if late := waitWorkers(ws, c.cfg.ShutdownTimeout); len(late) > 0 {
		for _, w := range late {
			w.stop(true)
		}
		for _, w := range waitWorkers(late, min(abortGrace, c.cfg.ShutdownTimeout)) {
			w.abandon()
		}
	}
	for _, w := range ws {
		w.resume()
		c.m.lag.DeleteLabelValues(w.tp.topic, fmt.Sprint(w.tp.partition))
		c.m.registryHeld.DeleteLabelValues(w.tp.topic, fmt.Sprint(w.tp.partition))
	}
}

// waitWorkers waits up to d for the workers ws to end, and returns those
// still running.
func waitWorkers(ws []*worker, d time.Duration) []*worker {
	t := time.NewTimer(d)
	defer t.Stop()
	for i, w := range ws {
		select {
		case <-w.done:
		case <-t.C:
			var late []*worker
			for _, w := range ws[i:] {
				select {
				case <-w.done:
				default:
					late = append(late, w)
				}
			}
			return late
		}
	}
	return nil
}

func contains(ps []int32, p int32) bool {
	for _, x := range ps {
		if x == p {
			return true
		}
	}
	return false
}
