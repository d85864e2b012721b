package sink

import (
	"context"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// In at-least-once mode the flusher hands records to the client in turns,
// through two gates (see rounds.go for why):
//
//   - A key's records go only once every record of that key sent in an
//     earlier turn has been answered. This is what keeps a key's records in
//     order after a failure: the answer that failed a record breaks the
//     sink before it frees the key.
//   - A broker's records go only once every record sent to it in an earlier
//     turn has been answered: one turn in flight per broker, so that a slow
//     broker gets few large requests rather than many small ones, and holds
//     back only the partitions it leads. The broker is the leader of the
//     record's partition as the client last knew it (the partition hashed
//     from the key as the client does); a record whose broker is not known
//     yet passes this gate.
//
// Records of one key or one broker that pass in the same turn go together.
// A record that cannot pass waits in its key's or its broker's lane, out of
// the queue but counted against its limits, and goes in the turn after the
// lane is freed.

// lane is a key's or a broker's records with the client and waiting.
type lane struct {
	unanswered int      // sent to the client and not yet answered
	turn       uint64   // the turn that last sent a record of the lane
	waiting    []queued // in order, to place again once the lane is free
	// parked counts, for a key, its records waiting in a broker's lane;
	// the key's later records wait behind them.
	parked int
	freed  bool // on the gate's list of lanes to release
}

// keyGate holds the lanes. Only the flusher places records; the client's
// callbacks answer them.
type keyGate struct {
	mu           sync.Mutex
	turn         uint64
	keys         map[string]*lane
	brokers      map[int32]*lane
	freedKeys    []string
	freedBrokers []int32
	spare        []*lane
}

// busy reports whether a record of l must wait. The caller holds g.mu.
func (g *keyGate) busy(l *lane) bool {
	return l != nil && (len(l.waiting) > 0 || l.parked > 0 || l.unanswered > 0 && l.turn != g.turn)
}

// lane returns l, or a new lane if l is nil. The caller holds g.mu.
func (g *keyGate) lane(l *lane) *lane {
	if l != nil {
		return l
	}
	if n := len(g.spare); n > 0 {
		l = g.spare[n-1]
		g.spare = g.spare[:n-1]
		return l
	}
	return &lane{}
}

// place sends it (true) or has it wait in its key's or broker's lane.
func (g *keyGate) place(it queued) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.keys[it.key]
	if g.busy(k) {
		k.waiting = append(k.waiting, it)
		return false
	}
	var b *lane
	if it.broker >= 0 {
		b = g.brokers[it.broker]
		if g.busy(b) {
			b.waiting = append(b.waiting, it)
			k = g.lane(k)
			k.parked++
			g.keys[it.key] = k
			return false
		}
		b = g.lane(b)
		b.unanswered++
		b.turn = g.turn
		g.brokers[it.broker] = b
	}
	k = g.lane(k)
	k.unanswered++
	k.turn = g.turn
	g.keys[it.key] = k
	return true
}

// answered counts a record placed by place answered.
func (g *keyGate) answered(key string, broker int32) (wake bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.keys[key]
	k.unanswered--
	if k.unanswered == 0 && k.parked == 0 {
		if len(k.waiting) == 0 {
			delete(g.keys, key)
			g.spare = append(g.spare, k)
		} else if !k.freed {
			k.freed = true
			g.freedKeys = append(g.freedKeys, key)
			wake = true
		}
	}
	if broker < 0 {
		return wake
	}
	b := g.brokers[broker]
	b.unanswered--
	if b.unanswered == 0 {
		if len(b.waiting) == 0 {
			delete(g.brokers, broker)
			g.spare = append(g.spare, b)
		} else if !b.freed {
			b.freed = true
			g.freedBrokers = append(g.freedBrokers, broker)
			wake = true
		}
	}
	return wake
}

// release starts the flusher's next turn: it appends to dst, in order, the
// records waiting in the lanes freed since the last turn, to be placed
// again, and returns it with their count and size.
func (g *keyGate) release(dst []queued) ([]queued, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.turn++
	from := len(dst)
	keys := g.freedKeys
	for _, id := range g.freedBrokers {
		b := g.brokers[id]
		for _, it := range b.waiting {
			g.keys[it.key].parked--
			keys = append(keys, it.key)
		}
		dst = append(dst, b.waiting...)
		clear(b.waiting)
		b.waiting, b.freed = b.waiting[:0], false
		if b.unanswered == 0 {
			delete(g.brokers, id)
			g.spare = append(g.spare, b)
		}
	}
	// A key's waiting records come after those it had parked.
	for _, key := range keys {
		k := g.keys[key]
		if k == nil {
			continue
		}
		k.freed = false
		if k.unanswered == 0 && k.parked == 0 && len(k.waiting) > 0 {
			dst = append(dst, k.waiting...)
			clear(k.waiting)
			k.waiting = k.waiting[:0]
		}
	}
	clear(keys)
	g.freedKeys, g.freedBrokers = keys[:0], g.freedBrokers[:0]
	size := 0
	for _, it := range dst[from:] {
		size += recordSize(it.r)
	}
	return dst, size
}

// drain takes every waiting record out of the lanes and returns them.
func (g *keyGate) drain() []queued {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []queued
	for key, k := range g.keys {
		out = append(out, k.waiting...)
		clear(k.waiting)
		k.waiting, k.parked, k.freed = k.waiting[:0], 0, false
		if k.unanswered == 0 {
			delete(g.keys, key)
			g.spare = append(g.spare, k)
		}
	}
	for id, b := range g.brokers {
		out = append(out, b.waiting...)
		clear(b.waiting)
		b.waiting, b.freed = b.waiting[:0], false
		if b.unanswered == 0 {
			delete(g.brokers, id)
			g.spare = append(g.spare, b)
		}
	}
	clear(g.freedKeys)
	g.freedKeys, g.freedBrokers = g.freedKeys[:0], g.freedBrokers[:0]
	return out
}

// flushByKey sends records as their keys and brokers allow until the queue
// is closed and empty.
func (s *Sink) flushByKey(ctx context.Context) {
	g := &s.keys
	g.keys, g.brokers = map[string]*lane{}, map[int32]*lane{}
	var spare, released []queued
	for {
		round, broken, closed := s.q.takeAll(spare)
		var size int
		released, size = g.release(released[:0])
		if len(released) > 0 {
			s.q.unhold(len(released), size)
		}
		if broken != nil {
			// Nothing is sent until Abort: what waits fails now.
			s.failWaiting(broken)
		}
		if len(round) == 0 && len(released) == 0 {
			if closed {
				return
			}
			<-s.q.work
			continue
		}
		// What waited goes before what the queue holds now (a key's
		// records in the queue came after those that wait).
		for _, batch := range [][]queued{released, round} {
			for _, it := range batch {
				switch {
				case it.barrier != nil:
					// Everything queued before Abort is answered: what
					// waits is failed (the sink is broken until here),
					// and the client's records answered.
					s.failWaiting(s.q.brokenNow())
					_ = s.cl.Flush(ctx)
					broken = s.q.pass(it.barrier)
				case broken != nil:
					it.done(it.r, broken)
				default:
					s.send(ctx, it)
				}
			}
		}
		clear(round)
		clear(released)
		spare = round[:0]
	}
}

// send hands it to the client, or has it wait (place).
func (s *Sink) send(ctx context.Context, it queued) {
	if !it.routed {
		it.broker, it.routed = s.brokerOf(it.r), true
	}
	if !s.keys.place(it) {
		s.q.hold(1, recordSize(it.r))
		return
	}
	key, broker, done := it.key, it.broker, it.done
	answer := func(r *kgo.Record, err error) {
		done(r, err)
		if s.keys.answered(key, broker) {
			s.q.wake()
		}
	}
	// The key was free, perhaps because its last record failed: that
	// record's callback broke the sink before it freed the key.
	if err := s.q.brokenNow(); err != nil {
		answer(it.r, err)
		return
	}
	if it.alone {
		// What the client holds goes first, then this record in a request
		// of its own.
		_ = s.cl.Flush(ctx)
		if err := s.q.brokenNow(); err != nil {
			answer(it.r, err)
			return
		}
		s.cl.Produce(it.ctx, it.r, answer)
		_ = s.cl.Flush(ctx)
		return
	}
	s.cl.Produce(it.ctx, it.r, answer)
}

// brokerOf returns the leader of r's partition as the client knows it, or
// -1 if it does not know it yet.
func (s *Sink) brokerOf(r *kgo.Record) int32 {
	p := r.Partition
	if p < 0 {
		v, ok := s.partitions.Load(r.Topic)
		if !ok {
			return -1
		}
		n := v.(*topicPartitioner).n.Load()
		if n <= 0 {
			return -1
		}
		p = int32(s.byKey.Partition(r, int(n)))
	}
	leader, _, err := s.cl.PartitionLeader(r.Topic, p)
	if err != nil {
		return -1
	}
	return leader
}

// failWaiting fails every waiting record with err (nil: none).
func (s *Sink) failWaiting(err error) {
	if err == nil {
		return
	}
	failed := s.keys.drain()
	if len(failed) == 0 {
		return
	}
	size := 0
	for _, it := range failed {
		size += recordSize(it.r)
		it.done(it.r, err)
	}
	s.q.unhold(len(failed), size)
}
