// Package proxy injects network faults for walrelay's tests. A Gate wraps a
// listener and can cut its connections, refuse new ones (Down), hold them
// without an answer as a network partition does (Partition), keep them open
// and silent (BlackHole) or delay every write (Slow), while the server behind it keeps running. A Proxy is a Gate
// on a loopback port that forwards to a target, for servers whose listener
// the test does not own (PostgreSQL, a real Kafka broker).
package proxy

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Gate is a listener whose connections can be cut, refused, held, stranded
// or slowed.
// Its methods are safe for concurrent use.
type Gate struct {
	net.Listener

	mu    sync.Mutex
	down  bool          // refuse (or, with hole, hold) new connections
	hole  bool          // while down: hold new connections instead of closing them
	held  []net.Conn    // connections held in the hole
	delay time.Duration // added before every write to an accepted connection
	quiet chan struct{} // while set: nothing passes either way (BlackHole); closed by Up
	conns map[*conn]bool
	// strand is closed by Close: every connection stranded (Strand) waits
	// for it.
	strand chan struct{}
	// stopped is set while Stop has closed the listener (closed by Up,
	// which listens again); closed once Close was called.
	stopped chan struct{}
	closed  bool
}

// NewGate wraps l.
func NewGate(l net.Listener) *Gate {
	return &Gate{Listener: l, conns: map[*conn]bool{}, strand: make(chan struct{})}
}

// Cut closes every accepted connection now; new ones are accepted as before.
func (g *Gate) Cut() {
	g.mu.Lock()
	cut := make([]*conn, 0, len(g.conns))
	for c := range g.conns {
		cut = append(cut, c)
	}
	g.mu.Unlock()
	for _, c := range cut {
		c.Close() // takes g.mu to forget itself
	}
}

// Down cuts every connection and refuses new ones until Up: the peer sees a
// connection refused at once.
func (g *Gate) Down() { g.setDown(false) }

// Partition cuts every connection and holds new ones open without an answer
// until Up, as a network partition does: the peer times out rather than
// being refused.
func (g *Gate) Partition() { g.setDown(true) }

func (g *Gate) setDown(hole bool) {
	g.mu.Lock()
	g.down, g.hole = true, hole
	g.mu.Unlock()
	g.Cut()
}

// Slow delays every write to an accepted connection by d (0 ends it), so
// each answer of the server behind the gate arrives d late.
func (g *Gate) Slow(d time.Duration) {
	g.mu.Lock()
	g.delay = d
	g.mu.Unlock()
}

// BlackHole keeps every connection open and lets nothing through it, either
// way, and holds new ones without an answer, until Up: a peer gone without
// a FIN or a reset (a dead host, a dropped route), which only a timeout of
// the client's own notices.
func (g *Gate) BlackHole() {
	g.mu.Lock()
	g.down, g.hole = true, true
	if g.quiet == nil {
		g.quiet = make(chan struct{})
	}
	g.mu.Unlock()
}

// Strand silences every accepted connection for good, either way, and
// never closes it until the gate is closed, even when the client closes
// its end: the server behind keeps its end open and hears nothing, as
// after a NAT or a load balancer lost the connection's state. New
// connections pass as before: only the old ones are lost.
func (g *Gate) Strand() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for c := range g.conns {
		c.stranded.Store(true)
	}
}

// strandedWait blocks a stranded connection's I/O until the gate is closed.
func (c *conn) strandedWait() error {
	if !c.stranded.Load() {
		return nil
	}
	<-c.g.strand
	return net.ErrClosed
}

func (g *Gate) quietCh() chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.quiet
}

// Stop closes the listener and every connection until Up, which listens on
// the same address again: the peer's connections are refused by the kernel
// (ECONNREFUSED), as when the server is stopped. Down's connections are
// accepted and closed at once instead.
func (g *Gate) Stop() {
	g.mu.Lock()
	if g.stopped != nil || g.closed {
		g.mu.Unlock()
		return
	}
	g.stopped = make(chan struct{})
	l := g.Listener
	g.mu.Unlock()
	l.Close()
	g.Cut()
}

// listenAgain ends Stop: it listens on the address again (retrying for a
// while, should the port be held meanwhile) and wakes Accept.
func (g *Gate) listenAgain() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped == nil {
		return
	}
	if !g.closed {
		addr := g.Listener.Addr()
		for i := 0; ; i++ {
			l, err := net.Listen(addr.Network(), addr.String())
			if err == nil {
				g.Listener = l
				break
			}
			if i == 50 {
				panic(fmt.Sprintf("proxy: listen on %s again after Stop: %v", addr, err))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	close(g.stopped)
	g.stopped = nil
}

// listener returns the listener now (Stop and Up replace it).
func (g *Gate) listener() net.Listener {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.Listener
}

// Addr returns the listener's address, the same across Stop and Up.
func (g *Gate) Addr() net.Addr { return g.listener().Addr() }

// Up ends Down, Partition, BlackHole, Slow and Stop: held connections are
// closed, silenced ones pass again, and new ones are accepted.
func (g *Gate) Up() {
	g.listenAgain()
	g.mu.Lock()
	g.down, g.hole, g.delay = false, false, 0
	held := g.held
	g.held = nil
	if g.quiet != nil {
		close(g.quiet)
		g.quiet = nil
	}
	g.mu.Unlock()
	for _, h := range held {
		h.Close()
	}
}

// Accept returns the next connection the gate lets through.
func (g *Gate) Accept() (net.Conn, error) {
	for {
		c, err := g.listener().Accept()
		if err != nil {
			g.mu.Lock()
			stopped, closed := g.stopped, g.closed
			g.mu.Unlock()
			if stopped != nil && !closed {
				<-stopped // Up listens again
				continue
			}
			return nil, err
		}
		g.mu.Lock()
		if g.down {
			if g.hole {
				g.held = append(g.held, c)
			} else {
				c.Close()
			}
			g.mu.Unlock()
			continue
		}
		tc := &conn{Conn: c, g: g}
		g.conns[tc] = true
		g.mu.Unlock()
		return tc, nil
	}
}

// Close closes the listener, every connection and every held one.
func (g *Gate) Close() error {
	g.mu.Lock()
	if !g.closed {
		close(g.strand)
	}
	g.closed = true
	g.mu.Unlock()
	err := g.listener().Close()
	g.Up()
	g.Cut()
	return err
}

func (g *Gate) writeDelay() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.delay
}

// conn is an accepted connection that the gate tracks and may slow.
type conn struct {
	net.Conn
	g        *Gate
	once     sync.Once
	stranded atomic.Bool
}

func (c *conn) Write(p []byte) (int, error) {
	if err := c.strandedWait(); err != nil {
		return 0, err
	}
	if q := c.g.quietCh(); q != nil {
		<-q
	}
	if d := c.g.writeDelay(); d > 0 {
		time.Sleep(d)
	}
	return c.Conn.Write(p)
}

func (c *conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err := c.strandedWait(); err != nil {
		return 0, err
	}
	if q := c.g.quietCh(); q != nil {
		<-q // what arrived in the black hole is passed on only after it
	}
	return n, err
}

func (c *conn) Close() error {
	if c.stranded.Load() {
		// Kept open, to the server too, until the gate is closed.
		go func() {
			<-c.g.strand
			c.close()
		}()
		return nil
	}
	return c.close()
}

func (c *conn) close() error {
	c.once.Do(func() {
		c.g.mu.Lock()
		delete(c.g.conns, c)
		c.g.mu.Unlock()
	})
	return c.Conn.Close()
}

// Proxy forwards connections from Addr to a target through a Gate.
type Proxy struct {
	*Gate
	target string
	wg     sync.WaitGroup
}

// New listens on a free loopback port and forwards to target (host:port).
func New(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	p := &Proxy{Gate: NewGate(l), target: target}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address to connect to instead of the target.
func (p *Proxy) Addr() string { return p.Listener.Addr().String() }

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() error {
	err := p.Gate.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.Gate.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.wg.Add(2)
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

// pipe copies src to dst until either side is closed or cut, then closes
// both. Cutting the accepted side ends both pipes.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}
