package recovery

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// TestReplayDLQHoldsBounded: dlq replay holds the dead letters it picked
// before sending them; past maxReplayHeld bytes of them it stops with an
// error naming the flags that pick fewer, rather than hold them all.
// (Not parallel: it lowers maxReplayHeld.)
func TestReplayDLQHoldsBounded(t *testing.T) {
	kc := kafkatest.Start(t)
	opts := []kgo.Opt{kgo.SeedBrokers(kc.Addrs()...)}
	cl, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic("walrelay.dlq"), kgo.AllowAutoTopicCreation())...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
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
