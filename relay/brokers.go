package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/backoff"
	"github.com/walrelay/walrelay/sink"
)

// PingBrokers asks p's brokers for their metadata, for up to 15 s: the
// start-up check that they answer.
func PingBrokers(ctx context.Context, p Publisher) error {
	pingCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := p.Ping(pingCtx); err != nil {
		return fmt.Errorf("kafka.brokers: %w", err)
	}
	return nil
}

// WaitForBrokers is PingBrokers at start, which waits for brokers that are
// down: while no broker accepts a connection (refused, no route, the dial
// timed out), it retries with backoff (1 s to 30 s) until one answers or
// ctx ends (ctx's error), as the pipeline holds and retries when Kafka goes
// away later, and while the resolver times out or fails (a DNS outage). A
// mistake in the configuration still fails at once: a host that does not
// resolve, a listener that does not speak Kafka (or wants TLS or SASL:
// it closes or resets the connection at the first request, as a TCP proxy
// with no backend up also does), a refusal of the broker's.
func WaitForBrokers(ctx context.Context, p Publisher, log *slog.Logger) error {
	var waitedSince, warned time.Time
	var brokers string
	if sb, ok := p.(interface{ SeedBrokers() []string }); ok {
		brokers = strings.Join(sb.SeedBrokers(), ",")
	}
	for n := 0; ; n++ {
		err := PingBrokers(ctx, p)
		if err == nil {
			if !waitedSince.IsZero() {
				log.Info("Kafka answers: starting", "waited", time.Since(waitedSince).Round(100*time.Millisecond), "attempts", n+1)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !BrokersDown(err) && !recovering(err) {
			return err
		}
		switch {
		case waitedSince.IsZero():
			waitedSince, warned = time.Now(), time.Now()
			log.Info("waiting for Kafka at start: nothing is read before it answers", "brokers", brokers, "err", err)
		case time.Since(warned) >= brokersWaitWarnEvery:
			// Repeated at WARN: a broker down for long, or an address that
			// was mistyped (a closed port, a host on a resolver that fails
			// rather than says it does not exist) looks the same from here.
			warned = time.Now()
			log.Warn("still waiting for Kafka at start: nothing is read before it answers; if the brokers' addresses are wrong (kafka.brokers), stop walrelay and fix them",
				"brokers", brokers, "waited", time.Since(waitedSince).Round(time.Second), "attempts", n+1, "err", err)
		default:
			log.Debug("Kafka is still not answering", "err", err, "attempt", n+1)
		}
		t := time.NewTimer(backoff.Wait(time.Second, 30*time.Second, n))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// brokersWaitWarnEvery is how often WaitForBrokers repeats, at WARN, that
// it is still waiting.
var brokersWaitWarnEvery = time.Minute

// BrokersDown reports whether err, from PingBrokers, says that no broker
// accepted a connection: refused, unreachable, a dial that timed out, or a
// resolver that timed out or failed (a DNS outage, SERVFAIL), as when Kafka
// or the cluster's DNS is stopped or restarting. A host that does not
// resolve (NXDOMAIN) is not down but misnamed, and a listener that
// answered is not down either: one that closed or reset the connection at
// its first request (not Kafka, wants TLS; a TCP proxy whose backends are
// all down looks the same, and fails fast too).
func BrokersDown(err error) bool {
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return !dnsErr.IsNotFound && (dnsErr.IsTimeout || dnsErr.IsTemporary)
	}
	for _, errno := range []syscall.Errno{syscall.ECONNREFUSED, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.EHOSTDOWN} {
		if errors.Is(err, errno) {
			return true
		}
	}
	var opErr *net.OpError
	return errors.As(err, &opErr) && opErr.Op == "dial" && opErr.Timeout()
}

// recovering reports whether err, from PingBrokers, is an answer that a
// healthy cluster gives for a while (sink.Held: a retriable code,
// UNKNOWN_SERVER_ERROR; the offsets topic not ready), or the client's word that the cluster names no
// controller or coordinator yet (a controller's election): WaitForBrokers
// waits for those as for brokers that are down. A connection closed or
// reset at the first request is not: that is a listener that does not speak
// Kafka, or wants TLS (BrokersDown).
func recovering(err error) bool {
	if sink.Held(err) || errors.Is(err, sink.ErrOffsetsTopicNotReady) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed) {
		return false
	}
	var ke *kerr.Error
	return !errors.As(err, &ke) && kgo.IsRetryableBrokerErr(err)
}
