package poll

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/recovery"
)

// TestClaimOrderOfOneTransaction: an outbox that had a created_at column
// defaulting to now() before walrelay migrate --poll (the time of the
// transaction: every row of one transaction the same) gets the default
// clock_timestamp(), so the rows of one transaction are claimed in the
// order they were inserted, whatever their ids (here the second row's id
// sorts first, as a random UUIDv4 does half the time). Before, the
// migration kept now(), and the claim fell back on the ids: [paid created].
func TestClaimOrderOfOneTransaction(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := migrations.Apply(ctx, conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "ALTER TABLE outbox ALTER COLUMN created_at SET DEFAULT now()"); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.ApplyPoll(ctx, conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
	l := decoder.Config{}.WithDefaults().Layouts()[0]
	if err := CheckTable(ctx, conn, l); err != nil {
		t.Fatalf("CheckTable after migrate --poll: %v", err)
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, r := range [][2]string{{"ffffffff-0000-4000-8000-000000000000", "created"}, {"00000000-0000-4000-8000-000000000000", "paid"}} {
			if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'o-1', $2, '{}')", r[0], r[1]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := recovery.Open(ctx, conn, l)
	if err != nil {
		t.Fatal(err)
	}
	tb := newTable(rt, Config{Ordering: OrderAggregate, OnDead: DeadSkip, BatchSize: 100, MaxBatchBytes: 1 << 20, MaxEventBytes: 1 << 20, Lease: 30e9})
	rows, _, err := tb.claim(ctx, conn, "w:1")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rows {
		got = append(got, r.e.Type)
	}
	if want := []string{"created", "paid"}; !slices.Equal(got, want) {
		t.Fatalf("one transaction's rows claimed as %v, want %v", got, want)
	}
}

// TestCheckTableRefusesTransactionTime: a created_at whose default is the
// transaction's or the statement's time (set back by hand after the
// migration) gives the rows of one transaction one time, so their order
// would rest on their ids: the poll source refuses the table and names the
// fix. Before, CheckTable did not look at the default.
func TestCheckTableRefusesTransactionTime(t *testing.T) {
	t.Parallel()
	conn, _ := claimFixture(t, Config{Ordering: OrderAggregate})
	l := decoder.Config{}.WithDefaults().Layouts()[0]
	for _, def := range []string{"now()", "CURRENT_TIMESTAMP", "transaction_timestamp()", "statement_timestamp()"} {
		if _, err := conn.Exec(t.Context(), "ALTER TABLE outbox ALTER COLUMN created_at SET DEFAULT "+def); err != nil {
			t.Fatal(err)
		}
		err := CheckTable(t.Context(), conn, l)
		if err == nil || !strings.Contains(err.Error(), "clock_timestamp()") {
			t.Errorf("created_at DEFAULT %s: CheckTable returned %v, want a refusal naming clock_timestamp()", def, err)
		}
	}
	if _, err := conn.Exec(t.Context(), "ALTER TABLE outbox ALTER COLUMN created_at SET DEFAULT clock_timestamp()"); err != nil {
		t.Fatal(err)
	}
	if err := CheckTable(t.Context(), conn, l); err != nil {
		t.Errorf("created_at DEFAULT clock_timestamp(): %v", err)
	}
}
