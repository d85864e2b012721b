package produce

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"
)

// TestFenceClosesAndRefuses: a fenced broker's open connections are closed
// (a read on one returns at once, as an in-flight request's would), a new
// dial to it is refused without touching the network, the other broker's
// connections stay open, and lifting the fence lets dials through again.
func TestFenceClosesAndRefuses(t *testing.T) {
	var addrs []string
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { c.Close() }) // silent: never answers
			}
		}()
		addrs = append(addrs, l.Addr().String())
	}
	d := &net.Dialer{}
	f := NewFences(d.DialContext)
	ctx := context.Background()
	dial := func(addr string) net.Conn {
		t.Helper()
		c, err := f.DialContext(ctx, "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	silent, other := dial(addrs[0]), dial(addrs[1])
	read := make(chan error, 1)
	go func() {
		_, err := silent.Read(make([]byte, 1))
		read <- err
	}()
	f.fence(addrs[0], 1, time.Now())
	select {
	case err := <-read:
		if err == nil {
			t.Fatalf("read on a fenced connection: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a read on the fenced broker's connection still waits")
	}
	if _, err := f.DialContext(ctx, "tcp", addrs[0]); err == nil {
		t.Fatal("a dial to a fenced broker went through")
	} else {
		t.Logf("refused: %v", err)
	}
	other.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := other.Read(make([]byte, 1)); err == nil || !isTimeout(err) {
		t.Fatalf("the other broker's connection was touched: %v", err)
	}
	f.lift(addrs[0])
	dial(addrs[0])
	if n := f.n.Load(); n != 0 {
		t.Fatalf("%d fenced after lift", n)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestFenceEnds: a fence ends when the other brokers list the node again,
// when they list another node id at its address (a broker replaced under a
// new id, which must be let in), and when none has listed it for
// fenceExpiry (a broker decommissioned: walrelay forgets it, and stops
// asking for it). Before, only the first ended it: the others stayed
// fenced for ever.
func TestFenceEnds(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	fencedAddr, other := l.Addr().String(), "127.0.0.1:1"
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		listed map[int32]string // the other broker's answer
		after  time.Duration    // since the fence
		ended  bool             // the fence ends
		forgot bool             // and node 1 is forgotten
	}{
		{"listed again", map[int32]string{1: fencedAddr, 2: other}, time.Second, true, false},
		{"another node id at its address", map[int32]string{2: other, 7: fencedAddr}, time.Second, true, true},
		{"unlisted, not yet for fenceExpiry", map[int32]string{2: other}, fenceExpiry - time.Second, false, false},
		{"unlisted for fenceExpiry", map[int32]string{2: other}, fenceExpiry, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &net.Dialer{}
			f := NewFences(d.DialContext)
			f.addrs[1], f.addrs[2] = fencedAddr, other
			f.fence(fencedAddr, 1, t0)
			now := t0.Add(tc.after)
			// Broker 2 answered just now, and has a request in flight
			// that is not late: look sends nothing, it judges.
			w := &Watcher{fences: f, log: slog.New(slog.DiscardHandler),
				asked: map[int32]time.Time{2: now}, answers: map[int32]brokerList{2: {listed: tc.listed, at: now}}}
			w.Look(t.Context(), now)
			if ended := f.n.Load() == 0; ended != tc.ended {
				t.Fatalf("fence ended: %v, want %v", ended, tc.ended)
			}
			_, known := f.addrs[1]
			if known == tc.forgot {
				t.Fatalf("node 1 forgotten: %v, want %v", !known, tc.forgot)
			}
			c, err := f.DialContext(t.Context(), "tcp", fencedAddr)
			if tc.ended != (err == nil) {
				t.Fatalf("dial to the address after the look: %v", err)
			}
			if c != nil {
				c.Close()
			}
		})
	}
}
