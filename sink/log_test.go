package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestConnFailuresFolded: the client's WARN line about a failed connection
// comes once per broker in connRepeatQuiet; its repeats are at debug level,
// and the next WARN line counts them.
func TestConnFailuresFolded(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	a := newSlogAdapter(slog.New(slog.NewTextHandler(&buf, nil))) // info and above
	for range 50 {
		for _, addr := range []string{"k1:9092", "k2:9092"} {
			a.Log(kgo.LogLevelWarn, "unable to open connection to broker", "addr", addr, "broker", "1", "err", "connection refused")
		}
	}
	a.Log(kgo.LogLevelWarn, "another warning", "addr", "k1:9092")
	if n := strings.Count(buf.String(), "unable to open connection to broker"); n != 2 {
		t.Fatalf("%d WARN lines about failed connections for 2 brokers, want 2:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "another warning") {
		t.Fatalf("another WARN line of the client was folded:\n%s", buf.String())
	}
	// A minute later: one line again, with the count of those folded.
	a.failed["k1:9092"].warned = a.failed["k1:9092"].warned.Add(-connRepeatQuiet)
	buf.Reset()
	a.Log(kgo.LogLevelWarn, "unable to open connection to broker", "addr", "k1:9092", "err", "connection refused")
	if !strings.Contains(buf.String(), "folded=49") {
		t.Fatalf("the next WARN line does not count the 49 folded: %s", buf.String())
	}
}

// TestConnFailureWithNewCauseWarns: a failed connection whose cause is not
// the one of the last WARN line of its broker is at WARN again, at once
// (Kafka was refusing, and comes back with a certificate walrelay does not
// trust): folding hides repeats, never a new cause. The same cause with a
// different local port (a reset) is a repeat.
func TestConnFailureWithNewCauseWarns(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	a := newSlogAdapter(slog.New(slog.NewTextHandler(&buf, nil)))
	reset := func(port int) error {
		return fmt.Errorf("unable to dial: %w", &net.OpError{Op: "read", Net: "tcp", Source: &net.TCPAddr{Port: port}, Err: os.NewSyscallError("read", syscall.ECONNRESET)})
	}
	for _, err := range []error{
		errors.New("dial tcp: connect: connection refused"),
		errors.New("dial tcp: connect: connection refused"),
		errors.New("tls: failed to verify certificate: x509: certificate signed by unknown authority"),
		errors.New("tls: failed to verify certificate: x509: certificate signed by unknown authority"),
		reset(50001),
		reset(50002),
	} {
		a.Log(kgo.LogLevelWarn, "unable to open connection to broker", "addr", "k1:9092", "broker", "1", "err", err)
	}
	if n := strings.Count(buf.String(), "level=WARN"); n != 3 || !strings.Contains(buf.String(), "x509") || !strings.Contains(buf.String(), "connection reset") {
		t.Fatalf("%d WARN lines for 3 causes, 2 of each, want 3, one per cause:\n%s", n, buf.String())
	}
}

// TestPingResetAtOnceExplained: a listener that resets the connection at
// the first request (not Kafka, wants TLS, or a TCP proxy whose backends
// are all down) is explained as one that closes it, not left as the bare
// "connection reset by peer".
func TestPingResetAtOnceExplained(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*net.TCPConn).SetLinger(0) // close with a reset
			_ = c.Close()
		}
	}()
	sk, err := New(Config{Brokers: []string{ln.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	defer sk.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err = sk.Ping(ctx)
	if err == nil || !strings.Contains(err.Error(), "closed the connection before it answered its first request") || !strings.Contains(err.Error(), "proxy") {
		t.Fatalf("Ping of a listener that resets at once: %v", err)
	}
}
