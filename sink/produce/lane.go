package produce

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A lane's own work: it hands its records to its client in rounds of its
// own, one batch's worth of a partition's keyed records between two
// flushes, and nothing once the flusher's queue is broken (see Lanes).

// produce hands a record to the lane's client unless the sink is broken,
// and returns the error that breaks it if so (the caller fails the record).
func (ls *Lanes) produce(ctx context.Context, l *lane, it Item) error {
	if it.R.Partition >= 0 {
		ls.await(ctx, l, it.R)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ls.main.IsBroken() {
		if err := ls.main.BrokenNow(); err != nil {
			return err
		}
	}
	l.cl.Produce(it.Ctx, it.R, it.Done)
	return nil
}

// run sends a lane's rounds until its queue is closed and empty: what it
// holds goes to its client, which is then flushed, unless the sink is
// broken (package produce).
func (ls *Lanes) run(ctx context.Context, l *lane) {
	defer ls.wg.Done()
	var spare []Item
	// handed is what each partition's keyed records handed to the client
	// since its last flush take in a batch (WireSize): one batch's worth
	// at most, so that the flush sends a partition one batch, in one
	// request. More would be split over batches that the idempotent
	// client sends in requests in flight together (up to five per
	// broker): the split-in-flight pattern behind reorders (KAFKA-15591).
	handed := map[topicPartition]int{}
	for {
		round, _, ok := l.q.Take(-1, spare, time.Time{}, false)
		if !ok {
			if l.retired.Load() {
				l.cl.Close()
			}
			return
		}
		l.waiting.Store(time.Now().UnixNano())
		broken := ls.main.BrokenNow()
		produced := false
		flush := func() {
			if produced {
				// Returns once every record produced is answered, or
				// when Close cancels ctx (the client then fails the rest).
				_ = l.cl.Flush(ctx)
				produced = false
				clear(handed)
			}
			broken = ls.main.BrokenNow()
		}
		for _, it := range round {
			switch {
			case it.Barrier != nil:
				flush()
				close(it.Barrier)
			case broken != nil:
				it.Done(it.R, broken)
			case it.Alone:
				// In a request of its own, after what the round produced.
				flush()
				if broken != nil {
					it.Done(it.R, broken)
					continue
				}
				if broken = ls.produce(ctx, l, it); broken != nil {
					it.Done(it.R, broken)
					continue
				}
				produced = true
				flush()
			default:
				// A record past its partition's batch: what was handed
				// goes first. A record without a key is counted too: it
				// has no order of its own to keep, but the client puts it
				// in some partition's batch, beside keyed ones.
				tp, w := topicPartition{it.R.Topic, it.R.Partition}, WireSize(it.R)
				if n := batchOf(handed, tp); n > 0 && n+w > int(ls.roundCap(tp.topic))-BatchOverhead {
					flush()
					if broken != nil {
						it.Done(it.R, broken)
						continue
					}
				}
				handed[tp] += w
				// The sink may break while the round is handed over
				// (a failure, Abort): nothing more of it then.
				if broken = ls.produce(ctx, l, it); broken != nil {
					it.Done(it.R, broken)
					continue
				}
				produced = true
			}
		}
		flush()
		l.waiting.Store(0)
		clear(round)
		spare = round[:0]
	}
}

// batchOf returns what a keyed record of tp joins in its partition's batch
// among the records handed since the last flush (handed): those of tp,
// and those of its topic the client partitions itself (partition -1, in
// the lane of no broker), which may land in any partition of the topic.
// So for tp a partition, those of tp and of -1; for tp -1, those of -1 and
// the most of any one partition. Counted apart, a topic's first records
// (-1) and the next ones, of partition p once the count is known and
// gated into the same lane, could each fill a batch of p between two
// flushes: two batches of one partition in flight.
func batchOf(handed map[topicPartition]int, tp topicPartition) int {
	if tp.partition >= 0 {
		return handed[tp] + handed[topicPartition{tp.topic, -1}]
	}
	most := 0
	for k, n := range handed {
		if k.topic == tp.topic && k.partition >= 0 {
			most = max(most, n)
		}
	}
	return handed[tp] + most
}

const (
	// awaitRefresh is how often a lane asks its client again for fresh
	// metadata while it waits for a partition its client does not know.
	awaitRefresh = 500 * time.Millisecond
	// awaitPoll is how often it looks whether the client knows it now.
	awaitPoll = 5 * time.Millisecond
)

// await returns once the lane's client knows partition r.Partition of
// r.Topic, having it refresh its metadata (the flusher routes by the
// highest count any lane's client saw: this one may not know the topic's
// new partitions yet). It gives up after the request timeout, or when the
// sink breaks or closes: the client then fails the record ("invalid record
// partitioning choice"), which breaks the sink, and the topic's count is
// learnt again after the Abort (a topic deleted and made again with fewer
// partitions). A client that has not loaded the topic loads it when handed
// the record.
func (ls *Lanes) await(ctx context.Context, l *lane, r *kgo.Record) {
	var deadline, asked time.Time
	for {
		if ld, _, err := l.cl.PartitionLeader(r.Topic, r.Partition); ld >= 0 || err != nil {
			return
		}
		if ld, _, err := l.cl.PartitionLeader(r.Topic, 0); ld < 0 && err == nil {
			return // not loaded: the client loads it
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(ls.timeout)
		}
		if now.After(deadline) {
			ls.log.Warn("a broker's client does not learn a partition of a topic: the record fails, and the topic's partition count is learnt again", "topic", r.Topic, "partition", r.Partition, "broker", l.broker)
			ls.relearn.Store(r.Topic, struct{}{})
			return
		}
		if ls.main.IsBroken() || ctx.Err() != nil {
			return
		}
		if now.Sub(asked) >= awaitRefresh {
			l.cl.ForceMetadataRefresh()
			asked = now
		}
		t := time.NewTimer(awaitPoll)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}
