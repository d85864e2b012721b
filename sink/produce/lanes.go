package produce

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// In at-least-once mode each broker has a lane: a producer client of its
// own, with rounds of its own (a manual flush, as package produce explains), for
// the partitions that broker leads. A slow broker then holds back only its
// own partitions: one client's Flush waits for every broker the round went
// to, and a lane's rounds go to one broker. The flusher (package produce) takes
// each round of the sink's queue and hands every record to a lane, without
// waiting for the lanes' answers.
//
// Order per partition, and so per key, holds as with one client: a
// partition's records go to one lane, and to another only once every record
// of it handed to the first has been answered (the gate); within a lane a
// partition's keyed records go to the client one batch's worth between two
// flushes (run: a round past that is flushed in parts; the records of
// partition -1, which the client partitions, count as of every partition
// of their topic: batchOf), so a partition has one batch, in one request,
// in flight. A record whose
// partition is not known yet (the topic's first records, before the flusher
// knows the topic's partition count; a record without a key) goes to the
// lane of no broker (-1), and so do the topic's later records until those
// are answered. The partition a record goes to is the one the Java client
// picks (murmur2 of the key), set on the record before it goes to a lane.
// Its broker is the leader the lanes' clients last learnt (the highest
// leader epoch among them); a partition keeps its lane while it has records
// unanswered in it, even if its leader moved (that lane's client sends them
// to the new leader).
//
// The partition count a topic's keys are partitioned by is the flusher's
// (routing): the lanes' clients report the counts their metadata gives
// (PlacedPartitioner), the highest kept, and the flusher adopts a higher
// one only once every record it routed before is answered (a barrier: the
// lanes drained). So a topic that gains partitions moves each key at most
// once, from its old partition to its new one, at one position of the
// stream, which the sink logs. Lane clients refresh their metadata each on
// its own (every 5 minutes, or after an error), so a lane may be handed a
// record of a partition its client does not know yet: it has its client
// refresh its metadata and waits for the partition (await) rather than let
// the client fail the record.
//
// What the lanes hold, sent or not, counts against half of
// MaxBufferedRecords and MaxBufferedBytes (the queue has the other half):
// a slow broker that holds that much stops the flusher, and every lane.
// After a failure every lane fails what it has not sent (the sink is
// broken, queue.broken), and Abort waits for every lane.
//
// The lanes' clients share the sink's dialer (Fences) and the hooks
// given for the producer, but for HookNewClient: a hook that registers
// metrics once (kprom) sees the sink's first client only, and the others'
// events through this relay.

// lane is one broker's client and the records queued for it.
type lane struct {
	broker  int32 // -1: records whose broker is not known
	cl      *kgo.Client
	q       *Queue
	waiting atomic.Int64 // when its round in flight began (unix ns), 0 between rounds
	pending []Item       // routed to it, not yet released (the flusher's)
	// mu is held while the lane hands a record to its client, and by
	// abortBuffered while it aborts the client's records: a record
	// handed to the client once the abort has failed earlier ones of its
	// partition would be sent after them.
	mu sync.Mutex
	// retired is set when the lane's broker left the cluster (Retire):
	// the lane closes its client once it has run what it holds.
	retired atomic.Bool
}

// topicPartition names a partition; partition -1 stands for the topic's
// records whose partition is not known.
type topicPartition struct {
	topic     string
	partition int32
}

// gated is a partition's lane and how many of its records that lane holds
// unanswered.
type gated struct {
	lane *lane
	n    int
}

// Lanes are at-least-once mode's lanes, one per broker. Only the flusher
// routes records (Lanes is its Sender); the lanes' callbacks answer them.
type Lanes struct {
	main     *Queue // the flusher's queue: what breaks it stops every lane
	log      *slog.Logger
	timeout  time.Duration            // a request's
	roundCap func(topic string) int32 // a topic's batch cap in a round
	opts     []kgo.Opt                // a lane client's options
	byKey    kgo.TopicPartitioner
	seen     *sync.Map // topic -> the highest partition count a lane's client saw (*atomic.Int32)
	// routing is the partition count each topic's keys are partitioned
	// by (the flusher's; see lanes): it only grows, at a barrier.
	routing map[string]int32
	relearn sync.Map // topic -> struct{}: its count is learnt again at the next Abort (forget)
	wg      sync.WaitGroup
	routed  []*lane                  // the lanes with records pending (the flusher's)
	leaders map[topicPartition]int32 // the lanes' leaders, learnt once a round (the flusher's)

	mu     sync.Mutex
	all    map[int32]*lane
	gate   map[topicPartition]*gated
	recs   int           // records held by the lanes
	bytes  int           // and their size
	room   chan struct{} // closed, and replaced, when the lanes answer a record and full is set
	full   bool          // the flusher waits for room
	closed bool

	maxRecs, maxBytes int
}

// LanesConfig is what NewLanes needs.
type LanesConfig struct {
	Opts []kgo.Opt // a lane client's options; its partitioner a PlacedPartitioner counting into Seen
	// Seen holds, per topic, the highest partition count a lane's client
	// saw (*atomic.Int32).
	Seen *sync.Map
	// Queue is the flusher's queue: once it is broken, no lane hands its
	// client a record.
	Queue          *Queue
	Log            *slog.Logger
	RequestTimeout time.Duration
	// MaxRecords and MaxBytes bound what the lanes hold, sent or not.
	MaxRecords, MaxBytes int
	// RoundCap returns a topic's batch cap for a round.
	RoundCap func(topic string) int32
}

// NewLanes makes the lanes and the lane of no broker, which runs until ctx
// ends or Close.
func NewLanes(ctx context.Context, cfg LanesConfig) (*Lanes, error) {
	ls := &Lanes{
		main: cfg.Queue, log: cfg.Log, timeout: cfg.RequestTimeout, roundCap: cfg.RoundCap,
		opts: cfg.Opts, seen: cfg.Seen, routing: map[string]int32{}, leaders: map[topicPartition]int32{},
		byKey: kgo.StickyKeyPartitioner(nil).ForTopic(""), // murmur2 for keyed records
		all:   map[int32]*lane{}, gate: map[topicPartition]*gated{},
		room:    make(chan struct{}),
		maxRecs: max(cfg.MaxRecords, 1), maxBytes: max(cfg.MaxBytes, 1),
	}
	cl, err := kgo.NewClient(cfg.Opts...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	ls.start(ctx, -1, cl)
	return ls, nil
}

// start runs a lane of broker with its client; the caller holds ls.mu, or
// is NewLanes.
func (ls *Lanes) start(ctx context.Context, broker int32, cl *kgo.Client) *lane {
	l := &lane{broker: broker, cl: cl, q: NewQueue(math.MaxInt, math.MaxInt, 0)}
	ls.all[broker] = l
	ls.wg.Add(1)
	go ls.run(ctx, l)
	return l
}

// laneOf returns the lane of broker, creating it; the caller holds ls.mu.
func (ls *Lanes) laneOf(ctx context.Context, broker int32) *lane {
	if l := ls.all[broker]; l != nil {
		return l
	}
	cl, err := kgo.NewClient(ls.opts...)
	if err != nil { // New made lane -1 with the same options: not seen
		ls.log.Warn("cannot create a producer for a broker: its partitions go with the others", "broker", broker, "err", err)
		return ls.laneOf(ctx, -1)
	}
	return ls.start(ctx, broker, cl)
}

// leader returns the leader of a partition as the lanes' clients last
// learnt it, the highest leader epoch winning, or -1. The caller holds ls.mu.
func (ls *Lanes) leader(topic string, partition int32) int32 {
	best, epoch := int32(-1), int32(-1)
	for _, l := range ls.all {
		if ld, ep, err := l.cl.PartitionLeader(topic, partition); err == nil && ld >= 0 && ep > epoch {
			best, epoch = ld, ep
		}
	}
	return best
}

// send routes a record to its lane (see lanes), waiting within ctx for
// room; release hands the lanes what was routed. leaders caches
// partitions' leaders for the flusher's round. Only the flusher calls them.
func (ls *Lanes) send(ctx context.Context, it Item, leaders map[topicPartition]int32) {
	r := it.R
	if r.Partition < 0 && r.Key != nil {
		if n := ls.countOf(ctx, it); n > 0 {
			r.Partition = int32(ls.byKey.Partition(r, int(n)))
		}
	}
	size := it.Size
	ls.mu.Lock()
	for ls.recs > 0 && (ls.recs >= ls.maxRecs || ls.bytes+size > ls.maxBytes) && !ls.closed {
		room := ls.room
		ls.full = true
		ls.mu.Unlock()
		ls.release() // what waits to go frees room once answered
		select {
		case <-room:
		case <-ctx.Done():
			it.Done(it.R, fmt.Errorf("%w: the sink is closed", ErrNotSent))
			return
		}
		ls.mu.Lock()
	}
	if ls.closed {
		ls.mu.Unlock()
		it.Done(it.R, fmt.Errorf("%w: the sink is closed", ErrNotSent))
		return
	}
	key := topicPartition{r.Topic, r.Partition}
	g := ls.gate[key]
	if g == nil && key.partition >= 0 {
		// The topic's records of no known partition are unanswered: this
		// one follows them into their lane.
		if g1 := ls.gate[topicPartition{r.Topic, -1}]; g1 != nil {
			g = &gated{lane: g1.lane}
			ls.gate[key] = g
		}
	}
	if g == nil {
		broker := int32(-1)
		if key.partition >= 0 {
			var ok bool
			if broker, ok = leaders[key]; !ok {
				broker = ls.leader(key.topic, key.partition)
				leaders[key] = broker
			}
		}
		g = &gated{lane: ls.laneOf(ctx, broker)}
		ls.gate[key] = g
	}
	g.n++
	ls.recs++
	ls.bytes += size
	l := g.lane
	ls.mu.Unlock()
	done := it.Done
	it.Done = func(r *kgo.Record, err error) {
		done(r, err) // first: a failure breaks the sink before the gate opens
		ls.answered(key, size)
	}
	l.pending = append(l.pending, it)
	if len(l.pending) == 1 {
		ls.routed = append(ls.routed, l)
	}
}

// countOf returns the partition count the flusher partitions the keys of
// the record's topic by, 0 if it knows none yet. When a lane's client has seen more
// partitions than that, it adopts that count, once every record routed
// before is answered: the topic's keys then move at this record, and those
// routed before are acknowledged (or failed, and the sink broken) first.
func (ls *Lanes) countOf(ctx context.Context, it Item) int32 {
	topic := it.R.Topic
	cur := ls.routing[topic]
	v, ok := ls.seen.Load(topic)
	if !ok {
		return cur
	}
	seen := v.(*atomic.Int32).Load()
	if seen <= cur {
		return cur
	}
	if cur > 0 {
		ls.drain(ctx)
		if ctx.Err() != nil {
			return cur // closed: the record fails
		}
		args := []any{"topic", topic, "from", cur, "to", seen}
		if it.HasPos {
			args = append(args, "position", it.Pos.String())
		}
		ls.log.Warn("a topic gained partitions: its keys move to their new partitions from this position on, every record before it acknowledged; a consumer group may read a key's old and new partition concurrently", args...)
	}
	// A first count needs no barrier: the topic's records so far went to
	// the lane of no broker, and the gate holds its next ones there until
	// those are answered.
	ls.routing[topic] = seen
	return seen
}

// release hands every lane the records routed to it since the last
// release, in one piece: the lane sends them in one round if it is idle.
func (ls *Lanes) release() {
	for _, l := range ls.routed {
		if l.q.Release(l.pending) {
			for _, it := range l.pending {
				it.Done(it.R, fmt.Errorf("%w: the sink is closed", ErrNotSent))
			}
		}
		clear(l.pending)
		l.pending = l.pending[:0]
	}
	clear(ls.routed)
	ls.routed = ls.routed[:0]
}

// answered counts a record of key answered.
func (ls *Lanes) answered(key topicPartition, size int) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if g := ls.gate[key]; g != nil {
		if g.n--; g.n == 0 {
			delete(ls.gate, key)
		}
	}
	ls.recs--
	ls.bytes -= size
	if ls.full {
		ls.full = false
		close(ls.room)
		ls.room = make(chan struct{})
	}
}

// drain returns once every record routed to a lane before it is answered.
func (ls *Lanes) drain(ctx context.Context) {
	ls.release()
	ls.mu.Lock()
	var bs []chan struct{}
	for _, l := range ls.all {
		b := l.q.Barrier()
		bs = append(bs, b)
	}
	ls.mu.Unlock()
	for _, b := range bs {
		select {
		case <-b:
		case <-ctx.Done():
			return
		}
	}
}

// Each calls f with every lane's client, without holding ls.mu: f may
// wait for records to be answered (AbortBufferedRecords), and their
// callbacks take ls.mu (answered).
func (ls *Lanes) Each(f func(*kgo.Client)) {
	ls.mu.Lock()
	cls := make([]*kgo.Client, 0, len(ls.all))
	for _, l := range ls.all {
		cls = append(cls, l.cl)
	}
	ls.mu.Unlock()
	for _, cl := range cls {
		f(cl)
	}
}

// OldestWait returns when the oldest round in flight of a lane began (unix
// ns), or 0 if none is.
func (ls *Lanes) OldestWait() int64 {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var oldest int64
	for _, l := range ls.all {
		if w := l.waiting.Load(); w != 0 && (oldest == 0 || w < oldest) {
			oldest = w
		}
	}
	return oldest
}

// AbortBuffered fails every record the lanes' clients have not sent, and
// waits for those in flight to be answered. The sink is broken already
// (Queue.Abort): once abortBuffered has taken a lane's mu, the lane hands
// its client nothing more until the Abort barrier, so nothing of a round
// goes out after the records of it that the abort failed.
func (ls *Lanes) AbortBuffered(ctx context.Context) error {
	ls.mu.Lock()
	all := make([]*lane, 0, len(ls.all))
	for _, l := range ls.all {
		all = append(all, l)
	}
	ls.mu.Unlock()
	var first error
	for _, l := range all {
		l.mu.Lock()
		if err := l.cl.AbortBufferedRecords(ctx); err != nil && first == nil {
			first = err
		}
		l.mu.Unlock()
	}
	return first
}

// Close stops every lane once it has run what it holds, and closes its
// client; records not answered by then are failed.
func (ls *Lanes) Close() {
	ls.mu.Lock()
	ls.closed = true
	all := make([]*lane, 0, len(ls.all))
	for _, l := range ls.all {
		all = append(all, l)
	}
	ls.mu.Unlock()
	for _, l := range all {
		l.q.Close()
	}
	ls.wg.Wait()
	for _, l := range all {
		l.cl.Close()
	}
}

// forget has the flusher learn again the partition count of each topic a
// lane gave up waiting for (await); it runs at the Abort barrier, when
// nothing is in flight.
func (ls *Lanes) forget() {
	ls.relearn.Range(func(k, _ any) bool {
		topic := k.(string)
		ls.relearn.Delete(k)
		delete(ls.routing, topic)
		if v, ok := ls.seen.Load(topic); ok {
			v.(*atomic.Int32).Store(0)
		}
		ls.Each(func(cl *kgo.Client) { cl.PurgeTopicsFromClient(topic) }) // loaded fresh at its next record
		return true
	})
}

// Retire closes the lanes of the brokers the cluster no longer lists
// (listed: node id -> address) that hold no record unanswered; a lane's
// client is closed once the lane has run what it holds. A broker that
// comes back gets a lane anew when a partition it leads has a record.
func (ls *Lanes) Retire(listed map[int32]string) {
	ls.mu.Lock()
	if ls.closed {
		ls.mu.Unlock()
		return
	}
	busy := map[*lane]bool{}
	for _, g := range ls.gate {
		busy[g.lane] = true
	}
	var gone []*lane
	for id, l := range ls.all {
		if _, ok := listed[id]; ok || id < 0 || busy[l] || l.waiting.Load() != 0 {
			continue
		}
		delete(ls.all, id)
		gone = append(gone, l)
	}
	ls.mu.Unlock()
	for _, l := range gone {
		ls.log.Info("a broker left the cluster: walrelay closes its producer", "broker", l.broker)
		l.retired.Store(true)
		l.q.Close()
	}
}

// Clients returns each lane's client by its broker (-1: the lane of no
// broker).
func (ls *Lanes) Clients() map[int32]*kgo.Client {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	cls := make(map[int32]*kgo.Client, len(ls.all))
	for id, l := range ls.all {
		cls[id] = l.cl
	}
	return cls
}
