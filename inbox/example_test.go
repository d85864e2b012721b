package inbox_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walrelay/walrelay/inbox"
)

// runShipping creates one shipment per order event, exactly once, until ctx
// ends.
func runShipping(ctx context.Context, pool *pgxpool.Pool) error {
	c, err := inbox.New(inbox.Config{
		Postgres: pool, // the consumer's own database
		Brokers:  []string{"kafka:9092"},
		Topics:   []string{"outbox.event.order"},
		Group:    "shipping", // the consumer group; also the inbox's consumer name
		// Logger: lifecycle at INFO, retries and dead letters at WARN with
		// their reason and error. Nil: slog.Default().
		Logger: slog.Default().With("service", "shipping"),
	})
	if err != nil {
		return fmt.Errorf("create the inbox consumer: %w", err)
	}
	return c.Run(ctx, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO shipments (order_id) VALUES ($1)", string(m.Key))
		return err
	})
}

// The consumer of docs/inbox.md.
func Example_shipping() {
	_ = runShipping
}
