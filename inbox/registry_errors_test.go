package inbox_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/deadletter"
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
	r1.Value = registry.Frame(nil, 1, []byte{2})
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

// TestUndecodableReasonClippedInTheDeadLetter: with ValidateJSON, a record
// whose JSON Schema (draft-07, which asserts formats) refuses a 350 KB
// string as not a date was undecodable with the validator's reason whole:
// 1 MB, the string quoted three times. The handler returns that error, and
// the dead letter carried it in walrelay.error: over the producer's cap
// without the value too, retried for ever; the good record after it was
// not handled in 20 s (the review's
// TestProbe45InboxUndecodableReasonHoldsThePartition). walrelay.error holds
// 1 KiB of it now (package format may shorten the reason itself).
func TestUndecodableReasonClippedInTheDeadLetter(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		b, _ := json.Marshal(map[string]any{"schemaType": "JSON", "schema": `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"seq":{"type":"integer"},"d":{"type":"string","format":"date"}}}`})
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	reg, err := inbox.NewRegistry(inbox.RegistryConfig{URL: srv.URL, Timeout: 5 * time.Second, ValidateJSON: true})
	if err != nil {
		t.Fatal(err)
	}
	e := setup(t, 1)
	dlq := e.collectDLQ(t)
	bad := event(outbox.NewID(), "order-1", 1)
	bad.Value = registry.Frame(nil, 1, []byte(`{"seq":1,"d":"`+strings.Repeat("x", 350<<10)+`"}`))
	good := event(outbox.NewID(), "order-2", 2)
	good.Value = registry.Frame(nil, 1, []byte(`{"seq":2,"d":"2026-12-06"}`))
	e.produce(t, bad, good)
	e.start(t, inbox.Config{Registry: reg, MaxAttempts: 1, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond},
		func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			var v struct {
				Seq int `json:"seq"`
			}
			if err := m.Decode(ctx, &v); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO effects (event_id, key, seq) VALUES ($1, $2, $3)", m.ID, string(m.Key), v.Seq)
			return err
		})
	waitfor.Until(t, 20*time.Second, "the good record after an undecodable one handled", func() bool { return e.count(t) == 1 })
	dl := deadLetterOf(t, dlq, string(kafkatest.Header(bad, "id")))
	if got := kafkatest.Header(dl, sink.HeaderError); string(kafkatest.Header(dl, sink.HeaderReason)) != "undecodable" || len(got) > deadletter.MaxText {
		t.Errorf("reason %q, %s of %d bytes: want undecodable, at most %d bytes", kafkatest.Header(dl, sink.HeaderReason), sink.HeaderError, len(got), deadletter.MaxText)
	}
}
