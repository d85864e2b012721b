package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/outbox"
)

// Writer: the version column is a header (outbox.header_columns: aggregate_version).
func writeShipped(ctx context.Context, tx pgx.Tx, id string, version int, payload []byte) error {
	_, err := outbox.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: id, Type: "OrderShipped",
		Payload: payload, Headers: map[string]string{"aggregate_version": strconv.Itoa(version)}})
	return err
}

// Consumer (inbox handler): a stale event changes nothing and is not retried.
func apply(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	v, err := strconv.ParseInt(string(m.Headers["aggregate_version"]), 10, 64)
	if err != nil {
		return fmt.Errorf("event %s: aggregate_version: %w", m.ID, err)
	}
	tag, err := tx.Exec(ctx, `INSERT INTO orders_view (order_id, version, state) VALUES ($1, $2, $3)
		ON CONFLICT (order_id) DO UPDATE SET version = EXCLUDED.version, state = EXCLUDED.state
		WHERE orders_view.version < EXCLUDED.version`, string(m.Key), v, m.Type)
	if err == nil && tag.RowsAffected() == 0 {
		slog.Info("stale event ignored", "id", m.ID, "version", v)
	}
	return err
}

// The aggregate version pattern of docs/inbox.md, compiled with the
// packages: the writer puts the version in a header column, the consumer
// applies an event only if it is newer than what it holds.
func Example_aggregateVersion() {
	_, _ = writeShipped, apply
}

// newOrdered is the consumer of Version order (docs/inbox.md): each
// aggregate's events in the order of walrelay.aggregate_version.
func newOrdered(pool *pgxpool.Pool) (*inbox.Consumer, error) {
	return inbox.New(inbox.Config{
		Postgres: pool, Brokers: []string{"kafka:9092"}, Topics: []string{"outbox.event.order"}, Group: "shipping",
		VersionOrder: true,             // read the walrelay.aggregate_version header
		VersionWait:  30 * time.Second, // how long a version waits for the ones before it (the default)
	})
}

// The consumer of Version order, compiled with the package.
func Example_versionOrder() {
	_ = newOrdered
}
