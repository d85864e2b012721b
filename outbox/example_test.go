package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walrelay/walrelay/outbox"
)

// placeOrder saves an order and its OrderCreated event in one transaction:
// both commit, or neither does.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, orderID, customer string, total float64) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx) // undoes both unless Commit ran first
	if _, err := tx.Exec(ctx, "INSERT INTO orders (id, customer, total) VALUES ($1, $2, $3)", orderID, customer, total); err != nil {
		return fmt.Errorf("insert order %s: %w", orderID, err)
	}
	payload, err := json.Marshal(map[string]any{"id": orderID, "customer": customer, "total": total})
	if err != nil {
		return fmt.Errorf("encode order %s: %w", orderID, err)
	}
	if _, err := outbox.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: orderID, Type: "OrderCreated", Payload: payload}); err != nil {
		return fmt.Errorf("write the event of order %s: %w", orderID, err) // the order is rolled back with it
	}
	return tx.Commit(ctx)
}

// The README's writer: an order and its event in one transaction. The
// README and docs/ show each Go example of this file and the others
// verbatim (TestDocsShowCompiledExamples).
func Example_placeOrder() {
	_ = placeOrder
}
