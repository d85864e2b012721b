package poll

import (
	"slices"
	"strings"
	"testing"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/migrations"
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
	conn := serverConn(t)
	ctx := t.Context()
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
	insertCreatedPaid(t, conn)
	rows := claimAggregate(t, conn, l)
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
