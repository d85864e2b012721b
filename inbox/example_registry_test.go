package inbox_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walrelay/walrelay/inbox"
)

// Order is the Avro record of the order events, decoded by field name.
type Order struct {
	ID    int64   `avro:"id"`
	Total float64 `avro:"total"`
}

// runBilling consumes order events that walrelay wrote in Avro
// (kafka.value_format avro or registry_passthrough), decoding each value
// with the schema its id names in the registry.
func runBilling(ctx context.Context, pool *pgxpool.Pool) error {
	reg, err := inbox.NewRegistry(inbox.RegistryConfig{URL: "http://registry:8080/apis/ccompat/v7"})
	if err != nil {
		return fmt.Errorf("schema registry: %w", err)
	}
	c, err := inbox.New(inbox.Config{Postgres: pool, Brokers: []string{"kafka:9092"}, Topics: []string{"outbox.event.order"}, Group: "billing",
		Registry: reg}) // for m.Decode
	if err != nil {
		return fmt.Errorf("create the inbox consumer: %w", err)
	}
	return c.Run(ctx, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		var o Order
		if err := m.Decode(ctx, &o); err != nil { // reg.Decode(ctx, m.Key, &k) for an avro key
			return err // retried, then dead-lettered
		}
		_, err := tx.Exec(ctx, "INSERT INTO invoices (order_id, total) VALUES ($1, $2)", o.ID, o.Total)
		return err
	})
}

// The Avro consumer of docs/registry-consuming.md.
func Example_avro() {
	_ = runBilling
}
