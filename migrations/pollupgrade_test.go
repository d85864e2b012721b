package migrations

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
)

// TestParkingUpgradeWaitsBounded (review of issue 36 item 6): migrate
// --poll of an outbox migrated by the version before parking replaces the
// status check and builds the parked index. Behind a long transaction of
// the application on the outbox, it waits a bounded time for the table's
// lock, then fails naming the cause, having changed nothing, and the
// application's inserts meanwhile go through (they would queue behind an
// unbounded wait); once the transaction ends it is done, the check
// validated. A re-run on an outbox already migrated does not wait.
func TestParkingUpgradeWaitsBounded(t *testing.T) {
	was := createdAtLockWait
	createdAtLockWait = 300 * time.Millisecond
	t.Cleanup(func() { createdAtLockWait = was })
	for _, upgrade := range []bool{true, false} {
		name := map[bool]string{true: "upgrade", false: "rerun"}[upgrade]
		t.Run(name, func(t *testing.T) { parkingUpgrade(t, upgrade) })
	}
}

// preParking gives conn's outbox (migrated by ApplyPoll) the layout of the
// version before parking: the status check without PARKED, no parked
// index.
func preParking(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	for _, s := range []string{
		`ALTER TABLE outbox DROP CONSTRAINT outbox_walrelay_status, ADD CONSTRAINT outbox_walrelay_status CHECK (status IN ('PENDING', 'SENDING', 'SENT', 'DEAD'))`,
		`DROP INDEX outbox_walrelay_parked`,
	} {
		if _, err := conn.Exec(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	}
}

// parkingUpgrade runs the test on an outbox of the version before parking
// (upgrade) or of this version (a re-run, which changes nothing).
func parkingUpgrade(t *testing.T, upgrade bool) {
	ctx := t.Context()
	cs := conns(t, 3)
	conn, long, app := cs[0], cs[1], cs[2]
	polled(t, conn)
	if upgrade {
		preParking(t, conn)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', 'o-1', 'T', '{}')`); err != nil {
		t.Fatal(err)
	}
	// A transaction of the application that read the outbox and lasts.
	tx, err := long.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck
	if _, err := tx.Exec(ctx, "SELECT count(*) FROM outbox"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ApplyPoll(ctx, conn, decoder.Config{})
		done <- err
	}()
	time.Sleep(500 * time.Millisecond)
	// The application's next insert, with a second to go through.
	if _, err := app.Exec(ctx, "SET statement_timeout = 1000"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, insErr := app.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', 'o-2', 'T', '{}')`)
	took := time.Since(start)
	var migErr error
	select {
	case migErr = <-done:
	case <-time.After(3 * time.Second):
		t.Fatalf("migrate --poll (upgrade %v) behind a transaction that uses the table: still waiting after 3.5 s (no lock_timeout); an insert of the application meanwhile: %v after %s",
			upgrade, insErr, took.Round(time.Millisecond))
	}
	if insErr != nil {
		t.Fatalf("an insert of the application while migrate --poll waited: %v after %s (it queued behind the migration's lock)", insErr, took.Round(time.Millisecond))
	}
	if !upgrade {
		if migErr != nil {
			t.Fatalf("migrate --poll re-run on an outbox migrated already: %v, want nothing to wait for", migErr)
		}
		return
	}
	if migErr == nil || !strings.Contains(migErr.Error(), "the table's lock was not free within 300ms") {
		t.Fatalf("migrate --poll upgrade with the table in use: %v, want the bounded wait named", migErr)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := ApplyPoll(ctx, conn, decoder.Config{})
	if err != nil || len(res.Unbuilt) != 0 {
		t.Fatalf("migrate --poll once the transaction ended: %+v, %v", res, err)
	}
	var valid, parked bool
	if err := conn.QueryRow(ctx, `SELECT
		EXISTS (SELECT FROM pg_constraint WHERE conname = 'outbox_walrelay_status' AND convalidated AND pg_get_constraintdef(oid) LIKE '%''PARKED''%'),
		to_regclass('outbox_walrelay_parked') IS NOT NULL`).Scan(&valid, &parked); err != nil {
		t.Fatal(err)
	}
	if !valid || !parked {
		t.Fatalf("after the upgrade: status check with PARKED validated %v, parked index %v; want both", valid, parked)
	}
}

// TestParkingUpgradeOfLargeTable (review of issue 36 item 6): on an outbox
// over indexRowsAtOnce rows, migrate --poll does not build the parked index
// in its transaction (it would hold the writers for the build): it gives
// the CREATE INDEX CONCURRENTLY statement instead.
func TestParkingUpgradeOfLargeTable(t *testing.T) {
	ctx := t.Context()
	conn := conns(t, 1)[0]
	polled(t, conn)
	preParking(t, conn)
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) SELECT gen_random_uuid(), 'order', 'o', 'T', '{}' FROM generate_series(1, 11)`); err != nil {
		t.Fatal(err)
	}
	was := indexRowsAtOnce
	indexRowsAtOnce = 10
	t.Cleanup(func() { indexRowsAtOnce = was })
	res, err := ApplyPoll(ctx, conn, decoder.Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := `CREATE INDEX CONCURRENTLY IF NOT EXISTS "outbox_walrelay_parked" ON "public"."outbox" ("aggregateid", created_at, "id") WHERE status = 'PARKED'`
	if got := res.Unbuilt["public.outbox"]; len(got) != 1 || got[0] != want {
		t.Fatalf("statements to run by hand: %q, want [%s]", got, want)
	}
	if _, err := conn.Exec(ctx, want); err != nil {
		t.Fatalf("the statement given: %v", err)
	}
	if res, err := ApplyPoll(ctx, conn, decoder.Config{}); err != nil || len(res.Unbuilt) != 0 {
		t.Fatalf("migrate --poll once it was built: %+v, %v", res, err)
	}
}
