package inbox_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/outbox"
	"github.com/walrelay/walrelay/sink"
)

// TestDecodeErrorsUndecodableOrRetried: a handler that returns
// Message.Decode's error has a value that is not in Confluent's wire
// format dead-lettered at once (reason undecodable, 1 attempt), and a
// framed value whose schema the registry (down: nothing listens) cannot
// give retried past MaxAttempts without a dead letter, as when the
// database is down.
func TestDecodeErrorsUndecodableOrRetried(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close()
	reg, err := inbox.NewRegistry(inbox.RegistryConfig{URL: "http://" + down, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	unframed, framed := outbox.NewID(), outbox.NewID()
	r0 := event(unframed, "order-1", 1)
	r1 := event(framed, "order-1", 2)
	r1.Value = format.Frame(nil, 1, []byte{2})
	var runs [2]atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if m.ID == unframed {
			runs[0].Add(1)
		} else {
			runs[1].Add(1)
		}
		var v any
		return m.Decode(ctx, &v)
	}
	dlq, err := kafkatest.Collect(e.kc.Addrs(), `walrelay\.inbox\.dlq`)
	if err != nil {
		t.Fatal(err)
	}
	defer dlq.Close()
	e.produce(t, r0, r1)
	stop := e.start(t, inbox.Config{Registry: reg, MaxAttempts: 2, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond}, h)
	waitfor.Until(t, 30*time.Second, "the framed record run 6 times", func() bool { return runs[1].Load() >= 6 })
	time.Sleep(200 * time.Millisecond)
	dead := dlq.Records()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 {
		for _, d := range dead {
			t.Logf("dead letter %s: %s, %s attempts", kafkatest.Header(d, "id"), kafkatest.Header(d, sink.HeaderReason), kafkatest.Header(d, sink.HeaderAttempts))
		}
		t.Fatalf("%d dead letters, want 1 (the unframed value; the framed one retried while the registry is down)", len(dead))
	}
	d := dead[0]
	if string(kafkatest.Header(d, "id")) != unframed || string(kafkatest.Header(d, sink.HeaderReason)) != "undecodable" ||
		string(kafkatest.Header(d, sink.HeaderAttempts)) != "1" || runs[0].Load() != 1 ||
		!strings.Contains(string(kafkatest.Header(d, sink.HeaderError)), "wire format") {
		t.Fatalf("the unframed value's dead letter: id %s reason %s attempts %s error %q, handler runs %d; want undecodable at once",
			kafkatest.Header(d, "id"), kafkatest.Header(d, sink.HeaderReason), kafkatest.Header(d, sink.HeaderAttempts), kafkatest.Header(d, sink.HeaderError), runs[0].Load())
	}
}
