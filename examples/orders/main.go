// Command orders is an example service of the outbox pattern's write side:
// it places orders, writing each order row and its OrderCreated event in
// one transaction with package outbox. walrelay publishes the events from
// the WAL to the topic outbox.event.order; examples/shipping consumes them.
//
// It creates its own orders table and refuses to write into one it did not
// create. Run `walrelay migrate` on the database first (the outbox table,
// the publication, the slot), then:
//
//	go run ./examples/orders -dsn "$DATABASE_URL" -count 100
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/outbox"
)

func main() {
	dsn := flag.String("dsn", envOr("DATABASE_URL", "postgres://postgres:postgres@localhost:5432/postgres"), "the orders database (it holds the outbox table); $DATABASE_URL")
	count := flag.Int("count", 100, "orders to place; 0: until stopped")
	every := flag.Duration("every", 0, "time between orders")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dsn, *count, *every); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, dsn string, count int, every time.Duration) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	if err := ownTable(ctx, conn); err != nil {
		return err
	}
	placed := 0
	for count == 0 || placed < count {
		customer := fmt.Sprintf("customer-%d", rand.IntN(50))
		total := fmt.Sprintf("%d.%02d", 5+rand.IntN(200), rand.IntN(100))
		if _, err := placeOrder(ctx, conn, customer, total); err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		placed++
		if every > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(every):
			}
		}
		if ctx.Err() != nil {
			break
		}
	}
	fmt.Printf("%d orders placed\n", placed)
	return nil
}

// ordersMark is the comment that says this example created the orders table.
const ordersMark = "created by the walrelay example examples/orders"

// ownTable creates the orders table, or checks that this example created
// the one there: an application's own orders table is never written to.
func ownTable(ctx context.Context, conn *pgx.Conn) error {
	var comment *string
	err := conn.QueryRow(ctx, "SELECT obj_description(to_regclass('orders'), 'pg_class') FROM (SELECT to_regclass('orders') AS t) s WHERE t IS NOT NULL").Scan(&comment)
	switch {
	case err == nil && (comment == nil || *comment != ordersMark):
		return errors.New("a table orders exists that this example did not create: it writes only into its own; run it on a database of its own (-dsn)")
	case err == nil:
		return nil
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("look for the orders table: %w", err)
	}
	_, err = conn.Exec(ctx, `CREATE TABLE orders (
		id         uuid PRIMARY KEY,
		customer   text NOT NULL,
		total      numeric(12,2) NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now());
		COMMENT ON TABLE orders IS '`+ordersMark+`'`)
	if err != nil {
		return fmt.Errorf("create the orders table: %w", err)
	}
	return nil
}

// placeOrder writes the order and its event in one transaction: both
// commit, or neither does.
func placeOrder(ctx context.Context, conn *pgx.Conn, customer, total string) (string, error) {
	id := outbox.NewID()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "INSERT INTO orders (id, customer, total) VALUES ($1, $2, $3)", id, customer, total); err != nil {
		return "", fmt.Errorf("insert order: %w", err)
	}
	payload, err := json.Marshal(map[string]string{"order_id": id, "customer": customer, "total": total})
	if err != nil {
		return "", err
	}
	if _, err := outbox.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: id, Type: "OrderCreated", Payload: payload}); err != nil {
		return "", err
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("commit order %s: %w", id, err)
	}
	return id, nil
}
