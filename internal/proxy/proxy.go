// Package proxy is a TCP proxy for fault-injection tests: it forwards a
// loopback port to a target and can cut every connection through it, refuse
// new ones, or hold them in a black hole, while the target keeps running.
package proxy

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// Mode is what the proxy does with connections.
type Mode int

const (
	// Forward passes bytes both ways (the default).
	Forward Mode = iota
	// Refuse closes every connection at once, new ones on accept.
	Refuse
	// BlackHole cuts the connections there are and holds new ones open
	// without passing a byte, as a network partition does to a client that
	// reconnects; they are closed when the mode changes.
	BlackHole
)

// Proxy forwards connections from Addr to a target.
type Proxy struct {
	l      net.Listener
	target string

	mu    sync.Mutex
	mode  Mode
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// New listens on a free loopback port and forwards to target (host:port).
func New(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	p := &Proxy{l: l, target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address to connect to instead of the target.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Port is Addr's port.
func (p *Proxy) Port() int { return p.l.Addr().(*net.TCPAddr).Port }

// SetMode changes what happens to connections. Leaving Forward, or leaving
// BlackHole, closes every connection there is.
func (p *Proxy) SetMode(m Mode) {
	p.mu.Lock()
	old := p.mode
	p.mode = m
	var cut []net.Conn
	if old != m && (old == BlackHole || m != Forward) {
		for c := range p.conns {
			cut = append(cut, c)
		}
		clear(p.conns)
	}
	p.mu.Unlock()
	for _, c := range cut {
		c.Close()
	}
}

// Cut closes every connection through the proxy now; new ones are accepted
// as before.
func (p *Proxy) Cut() {
	p.mu.Lock()
	var cut []net.Conn
	for c := range p.conns {
		cut = append(cut, c)
	}
	clear(p.conns)
	p.mu.Unlock()
	for _, c := range cut {
		c.Close()
	}
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	err := p.l.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == Refuse {
		return false
	}
	for _, c := range cs {
		p.conns[c] = true
	}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		mode := p.mode
		p.mu.Unlock()
		switch mode {
		case Refuse:
			in.Close()
			continue
		case BlackHole:
			if !p.track(in) {
				in.Close()
			}
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		if !p.track(in, out) {
			in.Close()
			out.Close()
			continue
		}
		p.wg.Add(2)
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

// pipe copies src to dst until either side closes, then closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src) // ends when either side is closed or cut
	dst.Close()
	src.Close()
}
