package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/internal/testkit/freeport"
	"github.com/walrelay/walrelay/internal/testkit/proxy"
)

// RealClusterSize is how many nodes a RealCluster has.
const RealClusterSize = 3

// RealCluster is a three-node Apache Kafka cluster in KRaft mode, each node a
// broker and a controller, with replication factor 3 and
// min.insync.replicas 2 for every topic, on loopback, with small heaps.
// Its nodes can be killed, stopped, started again, frozen and cut off the
// network, one at a time, while clients write.
//
// Every connection between nodes, and every client's, goes through a proxy
// (internal/testkit/proxy), so that a node can be cut off: each node's
// client listener (which the nodes replicate over too) is advertised as a
// proxy's address, and each node reaches each other controller through a
// proxy of its own (controller.quorum.voters differs per node).
type RealCluster struct {
	Nodes   []*Node
	dir     string
	proxies []*proxy.Proxy
}

// Fencing is how soon a RealCluster fences a node that stopped heartbeating.
type Fencing int

const (
	// FastFencing: heartbeats every 500 ms, fenced after 4 s.
	FastFencing Fencing = iota
	// KafkaFencing: Kafka's defaults, heartbeats every 2 s, fenced after 9 s
	// (broker.heartbeat.interval.ms, broker.session.timeout.ms).
	KafkaFencing
)

// StartRealCluster starts a cluster that is stopped when the test ends.
func StartRealCluster(t TB, fencing Fencing) *RealCluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := NewRealCluster(ctx, fencing)
	if err != nil {
		t.Fatalf("start a three-node Apache Kafka cluster: %v", err)
	}
	t.Cleanup(c.Close)
	// Run before Close removes the nodes' files: a failed test shows what
	// the nodes said of their trouble.
	if r, ok := t.(interface {
		Failed() bool
		Logf(string, ...any)
	}); ok {
		t.Cleanup(func() {
			if r.Failed() {
				for _, n := range c.Nodes {
					r.Logf("kafka node %d, its last warnings and errors:\n%s", n.ID, n.trouble(40))
				}
			}
		})
	}
	return c
}

// NewRealCluster fetches (once) the broker's jars, formats three nodes of one
// cluster id and starts them, and waits until every node is a broker of
// the cluster.
func NewRealCluster(ctx context.Context, fencing Fencing) (*RealCluster, error) {
	lib, err := FetchKafka(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "walrelay-kafka-cluster")
	if err != nil {
		return nil, err
	}
	c := &RealCluster{dir: dir}
	ports, err := freeport.Get(2 * RealClusterSize)
	if err != nil {
		c.Close()
		return nil, err
	}
	link := func(port int) (*proxy.Proxy, error) {
		p, err := proxy.New(fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.proxies = append(c.proxies, p)
		}
		return p, err
	}
	for i := range RealClusterSize {
		c.Nodes = append(c.Nodes, &Node{ID: int32(i + 1), dir: filepath.Join(dir, fmt.Sprintf("node-%d", i+1))})
	}
	// voters[i] is node i's controller.quorum.voters: itself directly, the
	// others through proxies of its own.
	voters := make([][]string, RealClusterSize)
	for i, n := range c.Nodes {
		client, err := link(ports[i])
		if err != nil {
			c.Close()
			return nil, err
		}
		n.Addr, n.client = client.Addr(), client
		n.links = append(n.links, client)
		for j, m := range c.Nodes {
			if i == j {
				voters[i] = append(voters[i], fmt.Sprintf("%d@127.0.0.1:%d", n.ID, ports[RealClusterSize+i]))
				continue
			}
			to, err := link(ports[RealClusterSize+j])
			if err != nil {
				c.Close()
				return nil, err
			}
			voters[i] = append(voters[i], fmt.Sprintf("%d@%s", m.ID, to.Addr()))
			n.links = append(n.links, to) // n to m's controller
			m.links = append(m.links, to) // m's controller from n
		}
	}
	var id [16]byte
	_, _ = rand.Read(id[:])
	clusterID := base64.RawURLEncoding.EncodeToString(id[:])
	for i, n := range c.Nodes {
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			c.Close()
			return nil, err
		}
		java, jvm, err := JVM(n.dir, lib)
		if err != nil {
			c.Close()
			return nil, err
		}
		n.java = java
		n.jvm = append([]string{"-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"}, jvm...)
		fence := []string{
			// A node that stops answering is fenced, and its partitions'
			// leadership moved, within seconds rather than the default 9.
			"broker.heartbeat.interval.ms=500",
			"broker.session.timeout.ms=4000",
		}
		if fencing == KafkaFencing {
			fence = nil
		}
		props := strings.Join(append([]string{
			"process.roles=broker,controller",
			fmt.Sprintf("node.id=%d", n.ID),
			"controller.quorum.voters=" + strings.Join(voters[i], ","),
			fmt.Sprintf("listeners=PLAINTEXT://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d", ports[i], ports[RealClusterSize+i]),
			"advertised.listeners=PLAINTEXT://" + n.Addr,
			"inter.broker.listener.name=PLAINTEXT",
			"controller.listener.names=CONTROLLER",
			"listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
			"log.dirs=" + filepath.Join(n.dir, "data"),
			fmt.Sprintf("num.partitions=%d", Partitions),
			"default.replication.factor=3",
			"min.insync.replicas=2",
			"offsets.topic.replication.factor=3",
			"transaction.state.log.replication.factor=3",
			"transaction.state.log.min.isr=2",
			"unclean.leader.election.enable=false",
			"auto.create.topics.enable=true",
			"group.initial.rebalance.delay.ms=0",
		}, fence...), "\n") + "\n"
		n.conf = filepath.Join(n.dir, "server.properties")
		if err := os.WriteFile(n.conf, []byte(props), 0o644); err != nil {
			c.Close()
			return nil, err
		}
		format := exec.CommandContext(ctx, n.java, append(n.jvm, "kafka.tools.StorageTool", "format", "--cluster-id="+clusterID, "-c", n.conf)...)
		if out, err := format.CombinedOutput(); err != nil {
			c.Close()
			return nil, fmt.Errorf("format node %d: %v\n%s", n.ID, err, out)
		}
	}
	for _, n := range c.Nodes {
		if err := n.Start(); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.WaitHealthy(ctx, nil); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Addrs returns the client listener of every node.
func (c *RealCluster) Addrs() []string {
	var a []string
	for _, n := range c.Nodes {
		a = append(a, n.Addr)
	}
	return a
}

// Node returns the node of id.
func (c *RealCluster) Node(id int32) *Node {
	for _, n := range c.Nodes {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// WaitHealthy waits until every node is a broker of the cluster, every
// partition of topics (all topics if nil) has all three replicas in sync,
// and every node answers a client on its own listener (asked directly: the
// cluster's metadata, which any node gives, may name a node that does not
// answer yet).
func (c *RealCluster) WaitHealthy(ctx context.Context, topics []string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var direct []*kgo.Broker // each node's own listener
	for _, n := range c.Nodes {
		ncl, err := kgo.NewClient(kgo.SeedBrokers(n.Addr))
		if err != nil {
			return err
		}
		defer ncl.Close()
		direct = append(direct, ncl.SeedBrokers()[0])
	}
	var last string
	for {
		mctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		md, err := adm.Metadata(mctx, topics...)
		cancel()
		switch {
		case err != nil:
			last = err.Error()
		case len(md.Brokers) < RealClusterSize:
			last = fmt.Sprintf("%d of %d brokers", len(md.Brokers), RealClusterSize)
		default:
			last = ""
			for _, td := range md.Topics {
				for _, p := range td.Partitions {
					if len(p.ISR) < RealClusterSize || p.Leader < 0 {
						last = fmt.Sprintf("%s/%d: leader %d, in sync %v", td.Topic, p.Partition, p.Leader, p.ISR)
					}
				}
			}
			for i, b := range direct {
				if last != "" {
					break
				}
				rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				_, err := b.Request(rctx, kmsg.NewPtrApiVersionsRequest())
				cancel()
				if err != nil {
					last = fmt.Sprintf("node %d does not answer on its listener: %v", c.Nodes[i].ID, err)
				}
			}
			if last == "" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the cluster did not become healthy (%s): %w", last, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Leader returns the node that leads partition of topic. A cluster that
// does not answer, or names no leader, is asked again for 30 s: a node
// restarted a moment ago may still be starting.
func (c *RealCluster) Leader(ctx context.Context, topic string, partition int32) (*Node, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	deadline := time.Now().Add(30 * time.Second)
	for {
		md, err := adm.Metadata(ctx, topic)
		if err == nil {
			p, ok := md.Topics[topic].Partitions[partition]
			if ok && p.Leader >= 0 {
				return c.Node(p.Leader), nil
			}
			err = fmt.Errorf("%s/%d has no leader", topic, partition)
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// LeaderMoved asks the nodes other than from, in turn every 100 ms, which node leads
// partition of topic, and returns how long it took, from its call, until
// one other than from did: the cluster's own failover, as its metadata
// shows it. It returns an error if ctx ends first.
func (c *RealCluster) LeaderMoved(ctx context.Context, topic string, partition, from int32) (time.Duration, error) {
	began := time.Now()
	var clients []*kgo.Broker
	for _, n := range c.Nodes {
		if n.ID == from {
			continue
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(n.Addr))
		if err != nil {
			return 0, err
		}
		defer cl.Close()
		// The seed itself (a seed broker's id), never a node the client
		// learns of: a node frozen or killed is never asked.
		clients = append(clients, cl.SeedBrokers()[0])
	}
	for i := 0; ; i++ {
		cl := clients[i%len(clients)]
		req := kmsg.NewPtrMetadataRequest()
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := cl.Request(rctx, req)
		cancel()
		if err != nil {
			resp = nil
		}
		if mr, ok := resp.(*kmsg.MetadataResponse); ok && len(mr.Topics) == 1 {
			for _, p := range mr.Topics[0].Partitions {
				if p.Partition == partition && p.Leader >= 0 && p.Leader != from {
					return time.Since(began), nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("the leader of %s/%d did not move from node %d: %w", topic, partition, from, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Close stops every node and removes the cluster's files.
func (c *RealCluster) Close() {
	for _, n := range c.Nodes {
		n.Kill()
	}
	for _, p := range c.proxies {
		p.Close()
	}
	os.RemoveAll(c.dir)
}
