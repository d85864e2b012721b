package sink

import (
	"context"
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
	f := newFences(d.DialContext)
	ctx := context.Background()
	dial := func(addr string) net.Conn {
		t.Helper()
		c, err := f.dialContext(ctx, "tcp", addr)
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
	f.fence(addrs[0], 1)
	select {
	case err := <-read:
		if err == nil {
			t.Fatalf("read on a fenced connection: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a read on the fenced broker's connection still waits")
	}
	if _, err := f.dialContext(ctx, "tcp", addrs[0]); err == nil {
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
