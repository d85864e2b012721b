package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
)

// TestDeadLetterSpanOnlyWhenWritten: a dead-letter span says the record
// was dead-lettered (walrelay.dead_letter.reason) only once the dead
// letter was written; when the dead-letter topic refuses it (here with
// INVALID_RECORD, every time) and the consumer stops while it retries, the
// span ends in error as "not dead-lettered: ...", since the next owner
// handles the record again.
func TestDeadLetterSpanOnlyWhenWritten(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	r := event("bad", "k", 1)
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")})
	e.produce(t, r)
	const dlq = "shipping.dlq"
	e.produce(t, &kgo.Record{Topic: dlq}) // creates it
	refused := make(chan struct{}, 1)
	e.kc.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.kc.KeepControl()
		// The records are in: the only produce from here on is the dead
		// letter's (named by topic id, not name, in newer requests).
		pr := req.(*kmsg.ProduceRequest)
		select {
		case refused <- struct{}{}:
		default:
		}
		return kafkatest.RefuseProduce(pr, kerr.InvalidRecord.Code), nil, true
	})
	stop := e.start(t, inbox.Config{MaxAttempts: 1, TracerProvider: tp, DeadLetterTopic: dlq, RetryBackoffMin: time.Millisecond, RetryBackoffMax: 50 * time.Millisecond},
		func(context.Context, pgx.Tx, inbox.Message) error { return errors.New("no such order") })
	// The handler's failing span ends first; the dead letter then retries.
	waitfor.Until(t, 30*time.Second, "the handler's span", func() bool { return len(rec.Ended()) >= 1 })
	select {
	case <-refused:
	case <-time.After(30 * time.Second):
		t.Fatal("no dead letter produced")
	}
	time.Sleep(200 * time.Millisecond)
	_ = stop()
	var dl []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == "walrelay.dead_letter.reason" {
				t.Errorf("span %q status %v %q with %s=%s: no dead letter was written (the topic refused it)", s.Name(), s.Status().Code, s.Status().Description, a.Key, a.Value.String())
			}
		}
		if strings.HasPrefix(s.Status().Description, "not dead-lettered") {
			dl = append(dl, s)
		}
	}
	if len(dl) != 1 || dl[0].Status().Code != codes.Error {
		t.Errorf("%d spans ended as not dead-lettered, want 1 in error", len(dl))
	}
}
