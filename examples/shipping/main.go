// Command shipping is an example service of the outbox pattern's consume
// side: it reads OrderCreated events with package inbox and creates one
// shipment per order, in its own database, exactly once: a redelivered or
// duplicated event finds its id in the inbox and is skipped, in the same
// transaction as the shipment.
//
//	go run ./examples/shipping -dsn "$SHIPPING_DATABASE_URL" -brokers localhost:9092
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/inbox"
)

func main() {
	dsn := flag.String("dsn", envOr("SHIPPING_DATABASE_URL", "postgres://postgres:postgres@localhost:5432/postgres"), "the shipping database (its own: the inbox and the shipments); $SHIPPING_DATABASE_URL")
	brokers := flag.String("brokers", envOr("KAFKA_BROKERS", "localhost:9092"), "Kafka brokers, comma-separated; $KAFKA_BROKERS")
	topic := flag.String("topic", "outbox.event.order", "the orders' topic")
	group := flag.String("group", "shipping", "the consumer group (and the inbox's consumer name)")
	dlq := flag.String("dlq", "walrelay.inbox.dlq", "the dead-letter topic")
	session := flag.Duration("session-timeout", 10*time.Second, "the consumer group session timeout: how long a crashed member holds its partitions")
	rebalance := flag.Duration("rebalance-timeout", time.Minute, "how long a rebalance waits for the members to rejoin")
	instance := flag.String("instance-id", os.Getenv("SHIPPING_INSTANCE_ID"), "a name that stays the same across restarts (a pod's name): a restarted consumer takes its partitions back at once; $SHIPPING_INSTANCE_ID")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := inbox.Config{Brokers: strings.Split(*brokers, ","), Topics: []string{*topic}, Group: *group, DeadLetterTopic: *dlq, Logger: log,
		SessionTimeout: *session, InstanceID: *instance, KafkaOpts: []kgo.Opt{kgo.RebalanceTimeout(*rebalance)}}
	if err := run(ctx, *dsn, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "shipping:", err)
		os.Exit(1)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// order is the payload of an OrderCreated event.
type order struct {
	OrderID  string `json:"order_id"`
	Customer string `json:"customer"`
}

func run(ctx context.Context, dsn string, cfg inbox.Config) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	if err := inbox.Migrate(ctx, pool); err != nil {
		return err
	}
	// No unique constraint on order_id: the inbox alone keeps it to one
	// shipment per order.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS shipments (
		id         bigserial PRIMARY KEY,
		order_id   uuid NOT NULL,
		customer   text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("create the shipments table: %w", err)
	}
	cfg.Postgres = pool
	c, err := inbox.New(cfg)
	if err != nil {
		return err
	}
	return c.Run(ctx, ship)
}

// ship creates the shipment of an OrderCreated event in tx, the
// transaction that records the event in the inbox. Other event types are
// not shipping's business.
func ship(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	if m.Type != "OrderCreated" {
		return nil
	}
	var o order
	if err := json.Unmarshal(m.Value, &o); err != nil {
		return fmt.Errorf("decode the order of event %s: %w", m.ID, err)
	}
	_, err := tx.Exec(ctx, "INSERT INTO shipments (order_id, customer) VALUES ($1, $2)", o.OrderID, o.Customer)
	return err
}
