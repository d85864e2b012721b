package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"

	"github.com/walrelay/walrelay/internal/testkit/syncbuf"
)

// testAdapter is an adapter logging at info level and above to the
// buffer it returns.
func testAdapter() (*slogAdapter, *bytes.Buffer) {
	buf := new(bytes.Buffer)
	return newSlogAdapter(slog.New(slog.NewTextHandler(buf, nil))), buf
}

// TestConnFailuresFolded: a broker's failed connections come as one line
// of walrelay's naming the node, once in connRepeatQuiet; the client's
// lines are at debug level, and the next line of walrelay's counts them.
func TestConnFailuresFolded(t *testing.T) {
	t.Parallel()
	a, buf := testAdapter() // info and above
	for range 50 {
		for _, b := range []string{"1", "2"} {
			a.Log(kgo.LogLevelWarn, "unable to open connection to broker", "addr", "k"+b+":9092", "broker", b, "err", "connection refused")
		}
	}
	a.Log(kgo.LogLevelWarn, "another warning", "addr", "k1:9092")
	if n := strings.Count(buf.String(), "level=WARN"); n != 3 || strings.Contains(buf.String(), "unable to open connection to broker") ||
		!strings.Contains(buf.String(), "kafka node 1 (k1:9092) is unreachable: connection refused; retrying") || !strings.Contains(buf.String(), "kafka node 2 (k2:9092) is unreachable") {
		t.Fatalf("%d WARN lines for failed connections to 2 brokers and another warning, want one of walrelay's per broker and the other:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "another warning") {
		t.Fatalf("another WARN line of the client was folded:\n%s", buf.String())
	}
	// A minute later: one line again, with the count of those folded.
	a.ids[1].warned = a.ids[1].warned.Add(-connRepeatQuiet)
	buf.Reset()
	a.Log(kgo.LogLevelWarn, "unable to open connection to broker", "addr", "k1:9092", "broker", "1", "err", "connection refused")
	if !strings.Contains(buf.String(), "folded=49") || !strings.Contains(buf.String(), "failed_connects=51") {
		t.Fatalf("the next WARN line does not count the 49 folded of 51: %s", buf.String())
	}
}

// TestNodeRestartReadsAsOne: a node that answered before and restarts
// makes the client log, for every connection it tries while the node is
// away, "unable to request api versions" (ERROR) and a WARN line asking "is
// TLS misconfigured?" (91 of each in one nemesis run). They come as one line
// of walrelay's naming the node, without the hint, and one when it
// answers again; other error lines of the client keep their level.
func TestNodeRestartReadsAsOne(t *testing.T) {
	t.Parallel()
	a, buf := testAdapter()
	node := kgo.BrokerMetadata{NodeID: 2, Host: "kafka-2", Port: 9092}
	a.OnBrokerRead(node, 3, 100, 0, 0, nil) // it answered
	eof := &kgo.ErrFirstReadEOF{}
	for range 91 {
		a.Log(kgo.LogLevelWarn, "read from broker received EOF during api versions discovery, which often happens when the broker requires TLS and the client is not using it (is TLS misconfigured?)",
			"addr", "kafka-2:9092", "broker", "2", "err", io.EOF)
		a.Log(kgo.LogLevelError, "unable to request api versions", "broker", "2", "err", eof)
	}
	a.Log(kgo.LogLevelError, "unable to initialize sasl", "broker", "2", "err", errors.New("sasl refused"))
	a.OnBrokerRead(node, 3, 100, 0, 0, nil) // back
	a.OnBrokerRead(node, 3, 100, 0, 0, nil)
	out := buf.String()
	t.Logf("a node away for 91 connections:\n%s", out)
	if n := strings.Count(out, "level=WARN"); n != 1 || !strings.Contains(out, "kafka node 2 (kafka-2:9092) answered before and is unreachable") {
		t.Fatalf("%d WARN lines, want one of walrelay's naming the node:\n%s", n, out)
	}
	if strings.Contains(out, "TLS misconfigured") || strings.Contains(out, "unable to request api versions") {
		t.Fatalf("the client's lines about the node's absence are not folded:\n%s", out)
	}
	if n := strings.Count(out, "level=ERROR"); n != 1 || !strings.Contains(out, "unable to initialize sasl") {
		t.Fatalf("%d ERROR lines, want the client's other error line kept:\n%s", n, out)
	}
	if n := strings.Count(out, "is back"); n != 1 || !strings.Contains(out, `msg="kafka node 2 (kafka-2:9092) is back"`) || !strings.Contains(out, "failed_connects=182") {
		t.Fatalf("%d lines saying the node is back, want one counting the 182 failures:\n%s", n, out)
	}
}

// TestNeverReachedNodeKeepsTheHint: for a node that never answered, the
// client's hint may be right (TLS misconfigured): its lines keep their
// level, once per minute each, the repeats counted.
func TestNeverReachedNodeKeepsTheHint(t *testing.T) {
	t.Parallel()
	a, buf := testAdapter()
	for range 10 {
		a.Log(kgo.LogLevelWarn, "read from broker received EOF during api versions discovery, which often happens when the broker requires TLS and the client is not using it (is TLS misconfigured?)",
			"addr", "kafka-0:9093", "broker", "seed_0", "err", io.EOF)
		a.Log(kgo.LogLevelError, "unable to request api versions", "broker", "seed_0", "err", &kgo.ErrFirstReadEOF{})
	}
	out := buf.String()
	if strings.Count(out, "level=WARN msg=\"read from broker received EOF") != 1 || strings.Count(out, "level=WARN") != 1 || strings.Count(out, "level=ERROR") != 1 || strings.Contains(out, "is back") {
		t.Fatalf("want the client's hint at WARN and its error at ERROR once each:\n%s", out)
	}
	a.ids[math.MinInt32].hints["unable to request api versions|"+causeOf(&kgo.ErrFirstReadEOF{})].kept = time.Now().Add(-connRepeatQuiet)
	buf.Reset()
	a.Log(kgo.LogLevelError, "unable to request api versions", "broker", "seed_0", "err", &kgo.ErrFirstReadEOF{})
	if !strings.Contains(buf.String(), "level=ERROR") || !strings.Contains(buf.String(), "folded=9") {
		t.Fatalf("a minute later the client's error line is not logged with the count folded: %s", buf.String())
	}
}

// TestConnFailureWithNewCauseWarns: a failed connection whose cause is not
// the one of the last WARN line of its broker is at WARN again, at once
// (Kafka was refusing, and comes back with a certificate walrelay does not
// trust): folding hides repeats, never a new cause. The same cause with a
// different local port (a reset) is a repeat.
func TestConnFailureWithNewCauseWarns(t *testing.T) {
	t.Parallel()
	a, buf := testAdapter()
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

// TestDeadLetterLogQuotesALongIDOnce: an event of an 8,000-character id
// that is dead-lettered is named in the log by its id's first 128 bytes,
// not whole. Before, the line quoted all 8,000.
func TestDeadLetterLogQuotesALongIDOnce(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	var logs syncbuf.Buffer
	s := newSink(t, kc, Config{Linger: time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	e := newEvent(strings.Repeat("7", 8000))
	e.Invalid = errors.New("the row's payload is not JSON")
	if err := publish(t, s, e); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "dead-lettering event") {
		t.Fatalf("no dead-letter line:\n%.2000s", logs.String())
	}
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, e.ID) {
			t.Fatalf("a log line of %d bytes quotes the id whole: %.300s…", len(line), line)
		}
	}
}
