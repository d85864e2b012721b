package inbox_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walrelay/walrelay/inbox"
)

// Payment is the order events' value by its JSON names: the same struct
// reads a registered_jsonschema value (the JSON itself) and a
// registered_protobuf one (the message in JSON as protojson writes it,
// fields by their JSON name: order_id is orderId; an int64 would be a
// string, hence the int32 cents).
type Payment struct {
	OrderID string `json:"orderId"` // string order_id = 1;
	Cents   int32  `json:"cents"`   // int32 cents = 2;
}

// runPayments consumes order events that walrelay wrote with
// registered_protobuf or registered_jsonschema, and archives each one's
// schema id, type and JSON.
func runPayments(ctx context.Context, pool *pgxpool.Pool) error {
	reg, err := inbox.NewRegistry(inbox.RegistryConfig{URL: "http://registry:8080/apis/ccompat/v7",
		ValidateJSON: true}) // a JSON value invalid in its schema is undecodable
	if err != nil {
		return fmt.Errorf("schema registry: %w", err)
	}
	c, err := inbox.New(inbox.Config{Postgres: pool, Brokers: []string{"kafka:9092"}, Topics: []string{"outbox.event.order"}, Group: "payments",
		Registry: reg}) // for m.Decode and m.Decoded
	if err != nil {
		return fmt.Errorf("create the inbox consumer: %w", err)
	}
	return c.Run(ctx, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if m.Value == nil {
			return nil // a tombstone: nothing to decode
		}
		// Into the handler's type. A generated Protobuf message decodes
		// as it is: var o pb.OrderPaid; m.Decode(ctx, &o).
		var p Payment
		if err := m.Decode(ctx, &p); err != nil {
			// inbox.ErrUndecodable (not framed, unknown id, wrong
			// indexes, invalid): dead-lettered at once.
			// inbox.ErrRegistryUnavailable: retried until it answers.
			return err
		}
		// Or the schema id, type and value: a *dynamicpb.Message for
		// Protobuf, the JSON's plain values for JSON Schema.
		d, err := m.Decoded(ctx)
		if err != nil {
			return err
		}
		js, err := d.JSON()
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO payments (order_id, cents, schema_id, schema_type, event) VALUES ($1, $2, $3, $4, $5)",
			p.OrderID, p.Cents, int64(d.ID), d.Type, js)
		return err
	})
}

// The Protobuf and JSON Schema consumer of docs/registry-consuming.md.
func Example_registryFormats() {
	_ = runPayments
}
