// Package proxy is a TCP proxy for fault-injection tests: it forwards a
// loopback port to a target and can cut every connection through it while
// the target keeps running.
package proxy

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// Proxy forwards connections from Addr to a target.
type Proxy struct {
	l      net.Listener
	target string

	mu    sync.Mutex
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

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns[in], p.conns[out] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

// pipe copies src to dst until either side is closed or cut, then closes
// both.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}
