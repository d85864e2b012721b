package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/sink"
)

// pingPublisher answers Ping with its errors in turn, then nil.
type pingPublisher struct {
	errs  []error
	pings int
}

func (p *pingPublisher) Ping(context.Context) error {
	p.pings++
	if len(p.errs) == 0 {
		return nil
	}
	err := p.errs[0]
	p.errs = p.errs[1:]
	return err
}
func (p *pingPublisher) Publish(context.Context, *event.Event, sink.Done) {}
func (p *pingPublisher) Abort(context.Context) error                      { return nil }
func (p *pingPublisher) Close()                                           {}
func (p *pingPublisher) DataLosses() uint64                               { return 0 }

func TestBrokersDown(t *testing.T) {
	t.Parallel()
	dial := func(err error) error {
		return fmt.Errorf("reach kafka brokers k:9092: unable to dial: %w", &net.OpError{Op: "dial", Net: "tcp", Err: err})
	}
	for _, tc := range []struct {
		name string
		err  error
		down bool
	}{
		{"connection refused: Kafka stopped", dial(&osSyscallError{syscall.ECONNREFUSED}), true},
		{"no route to the host", dial(&osSyscallError{syscall.EHOSTUNREACH}), true},
		{"dial timed out", dial(timeoutError{}), true},
		{"host does not resolve", dial(&net.DNSError{Err: "no such host", Name: "k", IsNotFound: true}), false},
		{"the resolver timed out: a DNS outage", dial(&net.DNSError{Err: "i/o timeout", Name: "k", Server: "10.96.0.10:53", IsTimeout: true}), true},
		{"the resolver failed (SERVFAIL): a DNS outage", dial(&net.DNSError{Err: "server misbehaving", Name: "k", Server: "10.96.0.10:53", IsTemporary: true}), true},
		{"reset at the first request: not Kafka, wants TLS, or a proxy with no backend", fmt.Errorf("reach kafka brokers k:9092: %w", &net.OpError{Op: "read", Net: "tcp", Err: &osSyscallError{syscall.ECONNRESET}}), false},
		{"closed at once: not Kafka, or wants TLS", fmt.Errorf("reach kafka brokers k:9092: %w", errors.New("EOF")), false},
		{"answered, refused", errors.New("SASL_AUTHENTICATION_FAILED"), false},
	} {
		if got := relay.BrokersDown(tc.err); got != tc.down {
			t.Errorf("%s: BrokersDown = %v, want %v (%v)", tc.name, got, tc.down, tc.err)
		}
	}
}

// osSyscallError is an errno as the dialer wraps it.
type osSyscallError struct{ errno syscall.Errno }

func (e *osSyscallError) Error() string { return "connect: " + e.errno.Error() }
func (e *osSyscallError) Unwrap() error { return e.errno }

type timeoutError struct{}

func (timeoutError) Error() string { return "i/o timeout" }
func (timeoutError) Timeout() bool { return true }

// TestWaitForBrokers: brokers that refuse are waited for until they answer,
// and so is a cluster that answers as one recovering does; a host that does
// not resolve, and a refusal retrying cannot fix, fail at once; ctx ends
// the wait.
func TestWaitForBrokers(t *testing.T) {
	t.Parallel()
	refused := fmt.Errorf("unable to dial: %w", &net.OpError{Op: "dial", Net: "tcp", Err: &osSyscallError{syscall.ECONNREFUSED}})
	log := slog.New(slog.NewTextHandler(t.Output(), nil))

	p := &pingPublisher{errs: []error{refused}}
	if err := relay.WaitForBrokers(t.Context(), p, log); err != nil || p.pings != 2 {
		t.Fatalf("refused once: %v after %d pings, want nil after 2", err, p.pings)
	}

	// A cluster that recovers: a held code at start (the offsets topic's
	// creation answered UNKNOWN_SERVER_ERROR, a coordinator loading) is
	// waited for; a refusal that retrying cannot fix is not.
	for _, held := range []error{kerr.UnknownServerError, kerr.CoordinatorLoadInProgress, kerr.NotController} {
		p = &pingPublisher{errs: []error{fmt.Errorf("create the offsets topic t: %w", held)}}
		if err := relay.WaitForBrokers(t.Context(), p, log); err != nil || p.pings != 2 {
			t.Fatalf("%v once: %v after %d pings, want nil after 2", held, err, p.pings)
		}
	}
	p = &pingPublisher{errs: []error{fmt.Errorf("create the offsets topic t: %w", kerr.ClusterAuthorizationFailed)}}
	if err := relay.WaitForBrokers(t.Context(), p, log); err == nil || p.pings != 1 {
		t.Fatalf("authorization refused: %v after %d pings, want an error after 1", err, p.pings)
	}

	unknown := fmt.Errorf("unable to dial: %w", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "k", IsNotFound: true}})
	p = &pingPublisher{errs: []error{unknown}}
	if err := relay.WaitForBrokers(t.Context(), p, log); err == nil || p.pings != 1 {
		t.Fatalf("unknown host: %v after %d pings, want an error after 1", err, p.pings)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	p = &pingPublisher{errs: []error{refused, refused, refused, refused}}
	if err := relay.WaitForBrokers(ctx, p, log); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctx ended while waiting: %v, want ctx's error", err)
	}
}

// seededPublisher is a pingPublisher that tells its seed brokers.
type seededPublisher struct {
	pingPublisher
	seeds []string
}

func (p *seededPublisher) SeedBrokers() []string { return p.seeds }

// TestWaitForBrokersWarnsNamingTheBrokers: second review of #37
// (review37b). A start waiting for Kafka repeats, at WARN (every minute;
// at every retry here), that it is still waiting, naming the brokers'
// addresses: a mistyped address (a closed port, a host on a resolver that
// fails) waits for ever, and said so only once, at INFO, without them.
func TestWaitForBrokersWarnsNamingTheBrokers(t *testing.T) {
	defer relay.SetBrokersWaitWarnEvery(0)()
	refused := fmt.Errorf("unable to dial: %w", &net.OpError{Op: "dial", Net: "tcp", Err: &osSyscallError{syscall.ECONNREFUSED}})
	var out strings.Builder
	log := slog.New(slog.NewTextHandler(&out, nil))
	p := &seededPublisher{pingPublisher{errs: []error{refused, refused}}, []string{"kafka-0.example:9092", "kafka-1.example:9092"}}
	if err := relay.WaitForBrokers(t.Context(), p, log); err != nil {
		t.Fatal(err)
	}
	var warned bool
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "still waiting for Kafka") && strings.Contains(line, "kafka-0.example:9092,kafka-1.example:9092") {
			warned = true
		}
	}
	if !warned {
		t.Fatalf("no WARN line naming the brokers while waiting:\n%s", out.String())
	}
}
