package relay_test

import (
	"context"
	"os"
	"time"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/sink"
)

// runEmbedded runs the relay inside the caller's process until ctx ends.
func runEmbedded(ctx context.Context, published func()) error {
	return relay.Run(ctx, relay.Config{
		ConnString: os.Getenv("DATABASE_URL"),
		CreateSlot: true,
		Outbox:     decoder.Config{Layout: decoder.Layout{Schema: "public", Table: "outbox"}},
		Sink:       sink.Config{Brokers: []string{"kafka:9092"}},
		Hooks: relay.Hooks{Acked: func(table, topic, deadLetter string, commit time.Time) {
			if deadLetter == "" {
				published()
			}
		}},
	})
}

// The embedded relay of docs/how-it-works.md.
func Example_embedded() {
	_ = runEmbedded
}
