package poll

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/migrations"
)

// TestRowsThereBeforeMigrateKeepInsertOrder: rows in an outbox before
// migrate --poll added the status column share a created_at within their
// aggregate (CreatedAtUnknown, when migrate added created_at; one
// transaction's now() under an old default). migrate --poll refuses the
// table until told what they are, naming both choices; with
// --existing-rows pending their claim keeps the order they were inserted
// in (the id of the later row sorts first here), and rows of unknown time
// still go out with no time; with --existing-rows sent they are SENT.
func TestRowsThereBeforeMigrateKeepInsertOrder(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup []string // before the two inserts
		oneTx bool
	}{
		{"unknown time", []string{`CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`}, false},
		{"now() default", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := serverConn(t)
			ctx := t.Context()
			for _, s := range tc.setup {
				if _, err := conn.Exec(ctx, s); err != nil {
					t.Fatal(err)
				}
			}
			if tc.oneTx {
				if _, err := migrations.Apply(ctx, conn, decoder.Config{}); err != nil {
					t.Fatal(err)
				}
				if _, err := conn.Exec(ctx, "ALTER TABLE outbox ALTER COLUMN created_at SET DEFAULT now()"); err != nil {
					t.Fatal(err)
				}
			}
			insertCreatedPaid(t, conn)
			if !tc.oneTx {
				if _, err := migrations.Apply(ctx, conn, decoder.Config{}); err != nil {
					t.Fatal(err)
				}
			}
			_, err := migrations.ApplyPoll(ctx, conn, decoder.Config{})
			var ee *migrations.ExistingRowsError
			if !errors.As(err, &ee) || !strings.Contains(err.Error(), "--existing-rows sent") || !strings.Contains(err.Error(), "--existing-rows pending") {
				t.Fatalf("migrate --poll on a table with rows and no status column, no choice: %v, want a refusal naming --existing-rows sent and pending", err)
			}
			pres, err := migrations.ApplyPollWith(ctx, conn, decoder.Config{}, migrations.PollOptions{ExistingRows: migrations.ExistingPending})
			if err != nil {
				t.Fatal(err)
			}
			if pres.Pending["public.outbox"] != 2 || pres.Stamped["public.outbox"] != 1 || pres.Tied["public.outbox"] != 0 {
				t.Fatalf("migrate --poll --existing-rows pending: pending %v, stamped %v, tied %v; want 2, 1, none", pres.Pending, pres.Stamped, pres.Tied)
			}
			l := decoder.Config{}.WithDefaults().Layouts()[0]
			if err := CheckTable(ctx, conn, l); err != nil {
				t.Fatal(err)
			}
			rows := claimAggregate(t, conn, l)
			var got []string
			for _, r := range rows {
				got = append(got, r.e.Type)
				if !tc.oneTx && !r.e.CommitTime.IsZero() {
					t.Errorf("row %s of unknown time (stamped apart) carries time %s, want none", r.e.Type, r.e.CommitTime)
				}
			}
			if want := []string{"created", "paid"}; !slices.Equal(got, want) {
				t.Fatalf("the rows of one aggregate in the table before migrate --poll claimed as %v, want insert order %v", got, want)
			}
		})
	}
}
