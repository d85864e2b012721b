// Package kafkatest runs franz-go's in-process kfake Kafka cluster on
// loopback TCP ports for walrelay's tests and demo, with switches that take
// the brokers off the network and back while the cluster keeps its data
// (Down: connections cut and refused; Partition: cut and then held without an
// answer; Slow: every answer delayed), a collector that reads every record of
// the outbox and dead-letter topics, and (real.go) a real Apache Kafka broker
// with listeners behind proxies that take the same switches.
package kafkatest

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/internal/testkit/proxy"
)

// Partitions is the partition count of auto-created topics.
const Partitions = 4

// Cluster is a kfake cluster whose listeners can be cut, partitioned and
// slowed (each listener is a proxy.Gate).
type Cluster struct {
	*kfake.Cluster
	mu    sync.Mutex
	gates []*proxy.Gate
}

// TB is the part of testing.TB that Start uses.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Start starts a cluster that is closed when the test ends.
func Start(t TB, opts ...kfake.Opt) *Cluster {
	t.Helper()
	c, err := New(opts...)
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// New starts a cluster of one broker that creates topics on demand with
// Partitions partitions; opts come last and may change that.
func New(opts ...kfake.Opt) (*Cluster, error) {
	c := &Cluster{}
	base := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(Partitions),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			l, err := net.Listen(network, "127.0.0.1:0")
			if err != nil {
				return nil, err
			}
			g := proxy.NewGate(l)
			c.mu.Lock()
			c.gates = append(c.gates, g)
			c.mu.Unlock()
			return g, nil
		}),
	}
	kc, err := kfake.NewCluster(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("start kfake cluster: %w", err)
	}
	c.Cluster = kc
	return c, nil
}

// Addrs returns the brokers' host:port addresses.
func (c *Cluster) Addrs() []string { return c.ListenAddrs() }

func (c *Cluster) each(fn func(*proxy.Gate)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, g := range c.gates {
		fn(g)
	}
}

// Node returns the gate of the broker listening on addr (one of Addrs), to
// fault one broker of a cluster of several, or nil if none listens there.
func (c *Cluster) Node(addr string) *proxy.Gate {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, g := range c.gates {
		if g.Addr().String() == addr {
			return g
		}
	}
	return nil
}

// Down cuts every connection to the brokers and refuses new ones until Up.
func (c *Cluster) Down() { c.each((*proxy.Gate).Down) }

// Partition cuts every connection and holds new ones open without an answer
// until Up, as a network partition does: clients time out rather than being
// refused.
func (c *Cluster) Partition() { c.each((*proxy.Gate).Partition) }

// Slow delays every answer of the brokers by d until Up.
func (c *Cluster) Slow(d time.Duration) { c.each(func(g *proxy.Gate) { g.Slow(d) }) }

// Stop closes the brokers' listeners until Up: new connections are refused
// by the kernel (connection refused), as when Kafka is stopped; the cluster
// keeps its data.
func (c *Cluster) Stop() { c.each((*proxy.Gate).Stop) }

// Up ends Down, Partition, Slow and Stop.
func (c *Cluster) Up() { c.each((*proxy.Gate).Up) }

// Network is what a fault test controls between walrelay and its broker:
// a kfake Cluster's listeners, or the proxy in front of a real broker's
// listener (Real.Faulty).
type Network interface {
	Down()
	Partition()
	Slow(d time.Duration)
	Up()
}

// Collector consumes topics matching a pattern from their start and keeps
// every record it reads.
type Collector struct {
	cl      *kgo.Client
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	records []*kgo.Record
	err     error
}

// Collect starts consuming every topic whose name matches pattern; opts
// (TLS, SASL) come last.
func Collect(brokers []string, pattern string, opts ...kgo.Opt) (*Collector, error) {
	if _, err := regexp.Compile(pattern); err != nil {
		return nil, fmt.Errorf("topic pattern %q: %w", pattern, err)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeRegex(),
		kgo.ConsumeTopics(pattern),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMinAge(50 * time.Millisecond),
		kgo.MetadataMaxAge(200 * time.Millisecond),
		kgo.FetchMaxWait(100 * time.Millisecond),
	}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("create consumer: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Collector{cl: cl, cancel: cancel, done: make(chan struct{})}
	go c.run(ctx)
	return c, nil
}

func (c *Collector) run(ctx context.Context) {
	defer close(c.done)
	for {
		fs := c.cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		var recs []*kgo.Record
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
		c.mu.Lock()
		c.records = append(c.records, recs...)
		fs.EachError(func(topic string, p int32, err error) {
			c.err = fmt.Errorf("fetch %s[%d]: %w", topic, p, err)
		})
		c.mu.Unlock()
	}
}

// Records returns a copy of every record read so far.
func (c *Collector) Records() []*kgo.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*kgo.Record(nil), c.records...)
}

// Wait waits until cond holds for the records read so far, or ctx ends.
func (c *Collector) Wait(ctx context.Context, cond func([]*kgo.Record) bool) ([]*kgo.Record, error) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		recs := c.Records()
		if cond(recs) {
			return recs, nil
		}
		select {
		case <-ctx.Done():
			return recs, fmt.Errorf("waiting for records (have %d): %w", len(recs), ctx.Err())
		case <-t.C:
		}
	}
}

// Close stops consuming.
func (c *Collector) Close() {
	c.cancel()
	<-c.done
	c.cl.Close()
}

// Header returns the value of the first header named key, or nil.
func Header(r *kgo.Record, key string) []byte {
	for _, h := range r.Headers {
		if h.Key == key {
			return h.Value
		}
	}
	return nil
}

// RefuseProduce answers a produce request with code for every partition it
// names, for tests that make the broker refuse records (newer requests name
// topics by id, so both name and id are echoed).
func RefuseProduce(pr *kmsg.ProduceRequest, code int16) *kmsg.ProduceResponse {
	resp := pr.ResponseKind().(*kmsg.ProduceResponse)
	for _, tp := range pr.Topics {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic, rt.TopicID = tp.Topic, tp.TopicID
		for _, part := range tp.Partitions {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition = part.Partition
			rp.ErrorCode = code
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

// FenceReinit answers a transactional producer's re-initialisation
// (InitProducerID at its own producer id; a new client asks with none, -1,
// and is let through) PRODUCER_FENCED whenever fence says so: the broker's
// false fence, Kafka's answer to the re-initialisation that follows a
// commit whose answer was lost. fence is asked only for
// re-initialisations, so it may count them.
func (c *Cluster) FenceReinit(fence func() bool) {
	c.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.InitProducerIDRequest)
		if r.ProducerID < 0 || !fence() {
			return nil, nil, false
		}
		resp := r.ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.ErrorCode, resp.ProducerID, resp.ProducerEpoch = kerr.ProducerFenced.Code, -1, -1
		return resp, nil, true
	})
}
