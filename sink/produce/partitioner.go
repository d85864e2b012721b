package produce

import (
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// PlacedPartitioner partitions a record that carries its own partition
// (Event.HasPartition: the sink's Publish set Record.Partition, or the
// flusher did, lanes.go) there, and any other by its key as the Java client does. A
// partition the topic lacks fails the record in the client; Publish
// dead-letters those it can tell. With counts, it keeps the highest
// partition count any lane's client has given it for each topic (topic ->
// *atomic.Int32): the flusher adopts a higher count at a barrier (lanes.go).
type PlacedPartitioner struct {
	ByKey  kgo.Partitioner
	Counts *sync.Map
}

// ForTopic implements kgo.Partitioner.
func (p PlacedPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	tp := &placedTopicPartitioner{byKey: p.ByKey.ForTopic(topic)}
	if p.Counts != nil {
		v, _ := p.Counts.LoadOrStore(topic, new(atomic.Int32))
		tp.seen = v.(*atomic.Int32)
	}
	return tp
}

type placedTopicPartitioner struct {
	byKey kgo.TopicPartitioner
	seen  *atomic.Int32 // the topic's highest partition count seen; nil: not kept
}

func (p *placedTopicPartitioner) RequiresConsistency(r *kgo.Record) bool {
	return r.Partition >= 0 || p.byKey.RequiresConsistency(r)
}

func (p *placedTopicPartitioner) Partition(r *kgo.Record, n int) int {
	if p.seen != nil {
		// Only ever up: a client whose metadata is older than another's
		// does not take the count back.
		for c := p.seen.Load(); int32(n) > c && !p.seen.CompareAndSwap(c, int32(n)); c = p.seen.Load() {
		}
	}
	if r.Partition >= 0 {
		return int(r.Partition) // the client refuses one out of range
	}
	return p.byKey.Partition(r, n)
}

// OnNewBatch passes the client's new-batch signal on to the key
// partitioner, which sticks keyless records to a partition between batches.
func (p *placedTopicPartitioner) OnNewBatch() {
	if nb, ok := p.byKey.(kgo.TopicPartitionerOnNewBatch); ok {
		nb.OnNewBatch()
	}
}
