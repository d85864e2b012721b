package recovery

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/sink"
)

// TestReplayDLQHoldsBounded: dlq replay holds the dead letters it picked
// before sending them; past maxReplayHeld bytes of them it stops with an
// error naming the flags that pick fewer, rather than hold them all.
// (Not parallel: it lowers maxReplayHeld.)
func TestReplayDLQHoldsBounded(t *testing.T) {
	cl, opts := dlqProducer(t)
	for range 3 {
		if err := cl.ProduceSync(t.Context(), &kgo.Record{Value: []byte(strings.Repeat("v", 600))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	defer func(n int) { maxReplayHeld = n }(maxReplayHeld)
	maxReplayHeld = 1000
	res, err := ReplayDLQ(t.Context(), nil, nil, opts, "walrelay.dlq", func(DeadLetter) bool { return true }, true)
	if err == nil || !strings.Contains(err.Error(), "--reason") {
		t.Fatalf("replayed %+v, error %v; want an error naming --reason", res, err)
	}
	maxReplayHeld = 4000
	if res, err := ReplayDLQ(t.Context(), nil, nil, opts, "walrelay.dlq", func(DeadLetter) bool { return true }, true); err != nil || res.Sent != 3 {
		t.Fatalf("under the bound: %+v, %v", res, err)
	}
}

// recordingPublisher is the sink as dlq replay sees it: it takes each
// event as published to its aggregate type's topic and remembers its id.
type recordingPublisher struct {
	mu  sync.Mutex
	ids []string
}

func (p *recordingPublisher) Topic(e *event.Event) string { return "outbox.event." + e.AggregateType }

func (p *recordingPublisher) Publish(_ context.Context, e *event.Event, done sink.Done) {
	p.mu.Lock()
	p.ids = append(p.ids, e.ID)
	p.mu.Unlock()
	done(sink.Delivery{Topic: p.Topic(e)}, nil)
}

// TestReplayDLQOfACutID: a dead letter whose id alone was over the
// dead-letter topic's cap holds a prefix of it (sink.HeaderIDOmitted).
// dlq replay names it not replayable: the row its prefix names, if any, is
// another one, and sent as the dead letter holds it, the event would carry
// another id. Here a row (an id column of type text) has the prefix for
// its id: before, dlq replay sent that row again, as the dead letter's.
func TestReplayDLQOfACutID(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	conn := migratedConn(t)
	prefix := strings.Repeat("p", 1000)
	for _, stmt := range []string{`ALTER TABLE outbox ALTER COLUMN id TYPE text`,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + prefix + `', 'order', 'a-1', 'Other', '{}')`} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	tb, err := Open(ctx, conn, decoder.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	cl, opts := dlqProducer(t)
	dl := &kgo.Record{Value: []byte("{}"), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(prefix)}, {Key: sink.HeaderReason, Value: []byte("invalid_event")},
		{Key: sink.HeaderTopic, Value: []byte("outbox.event.order")}, {Key: sink.HeaderIDOmitted, Value: []byte("64536")}}}
	if err := cl.ProduceSync(ctx, dl).FirstErr(); err != nil {
		t.Fatal(err)
	}
	p := &recordingPublisher{}
	res, err := ReplayDLQ(ctx, tb, p, opts, "walrelay.dlq", func(DeadLetter) bool { return true }, false)
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 0 || res.FromTable != 0 || len(p.ids) != 0 || len(res.NotReplayable) != 1 || !strings.Contains(res.NotReplayable[0], "its id is cut, 64536 bytes left out") {
		t.Fatalf("replayed %+v, published %d events: want none, and the dead letter named not replayable", res, len(p.ids))
	}
}

// dlqProducer starts a kfake cluster and returns a client that writes to
// its dead-letter topic walrelay.dlq (closed when the test ends), and the
// options that reach the cluster, for the code under test.
func dlqProducer(t *testing.T) (*kgo.Client, []kgo.Opt) {
	t.Helper()
	kc := kafkatest.Start(t)
	opts := []kgo.Opt{kgo.SeedBrokers(kc.Addrs()...)}
	cl, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic("walrelay.dlq"), kgo.AllowAutoTopicCreation())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl, opts
}
