package replication

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/internal/testkit/proxy"
)

// TestSessionConnectionCut: once the connection of a session is cut, the
// session writes nothing more to it. pgconn closes a connection whose read
// failed in a goroutine of its own, which sends Terminate through the
// connection's pgproto3.Frontend, a type not safe for concurrent use; a
// standby status update written through the same frontend by the status
// goroutine (which runs until Close) or by a Next called again was a data
// race, found under -race: the caller waits a few status intervals between
// the failed Next and Close, as a relay that finishes its events in flight
// does. A clean Close (a drain that stops as the connection is lost) skips
// its last status update and CopyDone, which wrote through the frontend
// too. Run it with -race.
func TestSessionConnectionCut(t *testing.T) {
	t.Parallel()
	pg := streamed(t, 1)
	cfg, err := pgconn.ParseConfig(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	px, err := proxy.New(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	host, port, err := net.SplitHostPort(px.Addr())
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port, cfg.Fallbacks = host, uint16(p), nil
	for _, c := range []struct {
		name     string
		interval time.Duration
		wait     bool // wait and call Next again before Close
		clean    bool // Close(nil), else Close(err)
	}{
		{"the status goroutine and Next after the cut", 10 * time.Millisecond, true, false},
		{"a clean Close at once", 10 * time.Second, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := New(Config{ConnConfig: cfg, StatusInterval: c.interval, BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond, StandbyRetry: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			for i := range 4 {
				sess, err := s.Open(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := sess.Next(ctx); err != nil {
					sess.Close(err)
					t.Fatalf("session %d: the first change: %v", i, err)
				}
				px.Cut()
				for err == nil {
					_, err = sess.Next(ctx)
				}
				if !connectionError(err) {
					sess.Close(err)
					t.Fatalf("session %d ended with %v, want the connection's end", i, err)
				}
				if c.wait {
					time.Sleep(5 * c.interval) // the status goroutine ticks meanwhile
					if _, again := sess.Next(ctx); !connectionError(again) {
						sess.Close(err)
						t.Fatalf("session %d: Next after the connection's end: %v, want the connection's end", i, again)
					}
				}
				if c.clean {
					sess.Close(nil)
				} else {
					sess.Close(err)
				}
			}
		})
	}
}
