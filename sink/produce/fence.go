package produce

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A leader that stops answering without closing its connections (a frozen
// process, a cut network: no FIN, no RST) holds every request sent to it
// until the request timeout, and the client, asked for metadata meanwhile,
// may ask that same node and wait again. The cluster itself notices sooner
// or later (it fences the node after broker.session.timeout.ms and moves its
// partitions' leadership), but the client learns of it only at its next
// metadata refresh that another node answers.
//
// So while a round waits, the sink asks every broker, on the client's own
// connections, for the cluster's brokers (a metadata request of no topic),
// every WatchEvery. A broker that did not answer within watchWait, while
// another answered with a list of brokers that lacks it, is fenced: the
// sink closes the connections to it (failing what is in flight there, which
// the client sends again, once, as idempotence allows), refuses new ones,
// and has the client refresh its metadata, which names the new leaders. A
// broker that answers is never fenced, however slow. The fence ends when
// the other brokers list it again; when they list another node id at its
// address (a broker replaced under a new id); or when none has listed it
// for fenceExpiry (a broker decommissioned, or fenced for good): the sink
// then forgets the node, and stops asking the others every WatchEvery. The
// stall after the cluster's own failover is then about WatchEvery,
// watchWait and one metadata refresh, whatever the request timeout.

const (
	// WatchAfter is how long a round waits before the sink starts asking.
	WatchAfter = 500 * time.Millisecond
	// WatchEvery is how often it asks while a round waits, or while a
	// broker is fenced.
	WatchEvery = 250 * time.Millisecond
	// watchWait is how long a broker may leave a request unanswered before
	// it counts as silent (a healthy one answers in milliseconds).
	watchWait = 500 * time.Millisecond
	// fenceExpiry is how long a fenced broker that no broker lists stays
	// fenced: by then every client of the sink has refreshed its
	// metadata (the fence had them do so) and no longer dials it.
	fenceExpiry = time.Minute
)

// DialFunc is the client's dialer.
type DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// Fences tracks the client's connections per broker address, closes those of
// a fenced broker, and refuses new ones to it.
type Fences struct {
	dial   DialFunc
	mu     sync.Mutex
	conns  map[string]map[*fencedConn]struct{}
	fenced map[string]int32     // address -> node id of the fenced broker
	since  map[string]time.Time // address -> when it was fenced
	n      atomic.Int32         // len(fenced)
	addrs  map[int32]string     // node id -> the address the client dialed
}

// OnBrokerConnect implements kgo.HookBrokerConnect: it learns each node's
// address.
func (f *Fences) OnBrokerConnect(m kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil || m.NodeID < 0 {
		return
	}
	f.mu.Lock()
	f.addrs[m.NodeID] = net.JoinHostPort(m.Host, strconv.Itoa(int(m.Port)))
	f.mu.Unlock()
}

// NewFences returns fences of the connections that dial makes.
func NewFences(dial DialFunc) *Fences {
	return &Fences{dial: dial, conns: map[string]map[*fencedConn]struct{}{}, fenced: map[string]int32{}, since: map[string]time.Time{}, addrs: map[int32]string{}}
}

// fencedConn is a connection the fences can close.
type fencedConn struct {
	net.Conn
	f    *Fences
	addr string
	once sync.Once
}

func (c *fencedConn) Close() error {
	c.once.Do(func() {
		c.f.mu.Lock()
		delete(c.f.conns[c.addr], c)
		c.f.mu.Unlock()
	})
	return c.Conn.Close()
}

// DialContext is the client's dialer: it refuses a fenced broker at once.
func (f *Fences) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	f.mu.Lock()
	id, fenced := f.fenced[addr]
	f.mu.Unlock()
	if fenced {
		return nil, fencedError(id, addr)
	}
	conn, err := f.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c := &fencedConn{Conn: conn, f: f, addr: addr}
	f.mu.Lock()
	defer f.mu.Unlock()
	if id, fenced := f.fenced[addr]; fenced { // fenced while it dialed
		conn.Close()
		return nil, fencedError(id, addr)
	}
	if f.conns[addr] == nil {
		f.conns[addr] = map[*fencedConn]struct{}{}
	}
	f.conns[addr][c] = struct{}{}
	return c, nil
}

// fencedError refuses a dial to a fenced broker.
func fencedError(id int32, addr string) error {
	return fmt.Errorf("broker %d (%s) is fenced: the cluster no longer lists it, and it does not answer", id, addr)
}

// fence closes every connection to addr and refuses new ones until lift.
func (f *Fences) fence(addr string, id int32, now time.Time) {
	f.mu.Lock()
	f.fenced[addr] = id
	f.since[addr] = now
	f.n.Store(int32(len(f.fenced)))
	var open []*fencedConn
	for c := range f.conns[addr] {
		open = append(open, c)
	}
	f.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

// lift ends the fence of addr.
func (f *Fences) lift(addr string) {
	f.mu.Lock()
	delete(f.fenced, addr)
	delete(f.since, addr)
	f.n.Store(int32(len(f.fenced)))
	f.mu.Unlock()
}

// forget ends the fence of addr and forgets node id, which the cluster no
// longer lists: the Watcher no longer asks it. If the node comes back, the
// client's next connection to it names it again (OnBrokerConnect).
func (f *Fences) forget(addr string, id int32) {
	f.lift(addr)
	f.mu.Lock()
	if f.addrs[id] == addr {
		delete(f.addrs, id)
	}
	f.mu.Unlock()
}

// fencedSince returns when addr was fenced.
func (f *Fences) fencedSince(addr string) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.since[addr]
}

// fencedAddrs returns the fenced addresses and their node ids.
func (f *Fences) fencedAddrs() map[string]int32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.fenced)
}

// WatchedDialer returns the dialer the client would use with opts (TLS
// included) and the TLS configuration among them, if any.
func WatchedDialer(opts []kgo.Opt) (DialFunc, *tls.Config, error) {
	cl, err := kgo.NewClient(append(opts[:len(opts):len(opts)], kgo.SeedBrokers("127.0.0.1:9092"))...)
	if err != nil {
		return nil, nil, fmt.Errorf("create kafka client: %w", err)
	}
	defer cl.Close()
	dial, _ := cl.OptValue(kgo.Dialer).(DialFunc)
	tlsCfg, _ := cl.OptValue(kgo.DialTLSConfig).(*tls.Config)
	if dial == nil {
		d := &net.Dialer{Timeout: 10 * time.Second}
		dial = d.DialContext
	}
	return dial, tlsCfg, nil
}

// A Watcher asks each broker for the cluster's brokers, one request in
// flight per broker, and judges by the answers it has (see Fences). Look is
// the one method its caller calls, from one goroutine.
type Watcher struct {
	fences  *Fences
	log     *slog.Logger
	timeout time.Duration      // a request's
	client  func() *kgo.Client // the client on whose connections it asks
	refresh func()             // has every client refresh its metadata, after a fence
	mu      sync.Mutex
	asked   map[int32]time.Time // node id -> when its request in flight was sent
	answers map[int32]brokerList
}

// NewWatcher returns a Watcher of the connections that f holds, asking on
// client's connections with requests of timeout, and calling refresh (to
// have every client refresh its metadata) after it fenced a broker.
func NewWatcher(f *Fences, log *slog.Logger, timeout time.Duration, client func() *kgo.Client, refresh func()) *Watcher {
	return &Watcher{fences: f, log: log, timeout: timeout, client: client, refresh: refresh,
		asked: map[int32]time.Time{}, answers: map[int32]brokerList{}}
}

// Fenced reports whether a broker is fenced.
func (f *Fences) Fenced() bool { return f.n.Load() != 0 }

// brokerList is a broker's last answer: the brokers it listed (node id ->
// address), nil if its request failed, and when it came.
type brokerList struct {
	listed map[int32]string
	at     time.Time
}

// Look sends a request to each broker the client connected to that has none
// in flight and is not fenced, then judges by the answers it has.
func (w *Watcher) Look(ctx context.Context, now time.Time) {
	f := w.fences
	fenced := f.fencedAddrs()
	f.mu.Lock()
	known := maps.Clone(f.addrs) // the brokers the client connected to
	f.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, addr := range known {
		if _, ok := fenced[addr]; ok {
			continue
		}
		if _, inFlight := w.asked[id]; inFlight {
			continue
		}
		w.asked[id] = now
		go w.ask(ctx, id)
	}
	w.judge(now, known, fenced)
}

// judge fences the brokers silent for watchWait (or whose last request
// failed) that another broker's fresh answer lacks, lifts the fence of
// those every fresh answer lists again, and of a fenced address at which a
// fresh answer lists another node id, and forgets a fenced broker that no
// fresh answer has listed for fenceExpiry. The caller holds w.mu.
func (w *Watcher) judge(now time.Time, known map[int32]string, fenced map[string]int32) {
	f := w.fences
	// Fresh answers: those of this look's last round of requests.
	var lists []map[int32]string
	for id, a := range w.answers {
		if a.listed != nil && now.Sub(a.at) < 2*WatchEvery+watchWait {
			if _, ok := fenced[known[id]]; !ok {
				lists = append(lists, a.listed)
			}
		}
	}
	if len(lists) == 0 {
		return // no broker answered: nothing to go by
	}
	unlisted := func(id int32) bool {
		for _, l := range lists {
			if _, ok := l[id]; !ok {
				return true
			}
		}
		return false
	}
	// listed reports whether a fresh answer lists node id, and returns a
	// node other than id that one lists at addr, or -1.
	listed := func(id int32, addr string) (bool, int32) {
		found, other := false, int32(-1)
		for _, l := range lists {
			for n, a := range l {
				if n == id {
					found = true
				} else if a == addr {
					other = n
				}
			}
		}
		return found, other
	}
	moved := false
	for id, addr := range known {
		if _, ok := fenced[addr]; ok {
			continue
		}
		sent, inFlight := w.asked[id]
		silent := inFlight && now.Sub(sent) >= watchWait
		if a, ok := w.answers[id]; !inFlight && ok && a.listed == nil {
			silent = true // its last request failed
		}
		if silent && unlisted(id) {
			w.log.Warn("a broker stopped answering and the cluster fenced it: walrelay closes its connections to it and sends to the partitions' new leaders", "broker", id, "addr", addr)
			f.fence(addr, id, now)
			delete(w.answers, id)
			moved = true
		}
	}
	for addr, id := range fenced {
		if !unlisted(id) {
			w.log.Info("a fenced broker is in the cluster again", "broker", id, "addr", addr)
			f.lift(addr)
			continue
		}
		found, other := listed(id, addr)
		switch {
		case other >= 0:
			w.log.Info("the cluster lists another broker at a fenced broker's address: the fence ends", "broker", other, "fenced", id, "addr", addr)
			f.forget(addr, id)
			delete(w.answers, id)
		case !found && now.Sub(f.fencedSince(addr)) >= fenceExpiry:
			w.log.Info("a fenced broker has left the cluster: walrelay forgets it", "broker", id, "addr", addr, "fenced_for", now.Sub(f.fencedSince(addr)).Round(time.Second))
			f.forget(addr, id)
			delete(w.answers, id)
		}
	}
	if moved {
		w.refresh()
	}
}

// ask sends broker id a metadata request of no topic (the brokers alone)
// and keeps its answer.
func (w *Watcher) ask(ctx context.Context, id int32) {
	rctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = []kmsg.MetadataRequestTopic{}
	a := brokerList{}
	if resp, err := w.client().Broker(int(id)).Request(rctx, req); err == nil {
		a.listed = map[int32]string{}
		for _, b := range resp.(*kmsg.MetadataResponse).Brokers {
			a.listed[b.NodeID] = net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
		}
	}
	a.at = time.Now()
	w.mu.Lock()
	delete(w.asked, id)
	w.answers[id] = a
	w.mu.Unlock()
}
