package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walrelay/walrelay/migrations"
)

// claimVersion is the comment migrations/inbox/0004 sets on the claim
// functions: Run refuses an inbox not migrated that far.
const claimVersion = "walrelay inbox claim, 0004"

// Migrate creates the default inbox table (public.walrelay_inbox) and its
// claim function in pool's database, if missing: what `walrelay migrate
// --inbox` does.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return migrate(ctx, pool, "public", "walrelay_inbox")
}

// Migrate creates the consumer's inbox table and its claim function, if
// missing.
func (c *Consumer) Migrate(ctx context.Context) error {
	return migrate(ctx, c.cfg.Postgres, c.cfg.Schema, c.cfg.Table)
}

func migrate(ctx context.Context, pool *pgxpool.Pool, schema, table string) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("inbox: connect: %w", err)
	}
	defer conn.Release()
	if err := migrations.ApplyInbox(ctx, conn.Conn(), schema, table); err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	return nil
}
