package migrations

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
)

// TestCreatedAtWaitsBounded: adding created_at to a table that a long
// transaction uses waits a bounded time for the table's lock, then fails
// naming the cause, having changed nothing (the application's writes
// would queue behind an unbounded wait); once the transaction ends, it is
// added.
func TestCreatedAtWaitsBounded(t *testing.T) {
	ctx := t.Context()
	pg := pgtest.Start(t)
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, pg.DSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	conn, other := connect(), connect()
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)`); err != nil {
		t.Fatal(err)
	}
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT count(*) FROM outbox"); err != nil {
		t.Fatal(err)
	}
	was := createdAtLockWait
	createdAtLockWait = 300 * time.Millisecond
	t.Cleanup(func() { createdAtLockWait = was })
	if _, err := Apply(ctx, conn, decoder.Config{}); err == nil || !strings.Contains(err.Error(), "the table's lock was not free within 300ms") {
		t.Fatalf("Apply with the table in use: %v, want the bounded wait named", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := Apply(ctx, conn, decoder.Config{}); err != nil || len(res.CreatedAt) != 1 {
		t.Fatalf("Apply after: %+v, %v", res, err)
	}
}
