package poll

import (
	"testing"
	"time"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/migrations"
)

// TestRowsOfUnknownTime: rows that were in the table when migrate added
// created_at carry migrations.CreatedAtUnknown (1970). The poll source
// gives them no time (no walrelay.commit_time, no WAL-wait span), and the
// age of the oldest due row leaves them out: before, they went out stamped
// 1970-01-01 and the lag read 56 years until they were sent.
func TestRowsOfUnknownTime(t *testing.T) {
	conn, tb := claimFixture(t, Config{})
	ids := map[string]string{}
	insert(t, conn, ids, "old", "old", "new")
	set(t, conn, ids["old-0"], "created_at = '"+migrations.CreatedAtUnknown+"'")
	set(t, conn, ids["old-1"], "created_at = '"+migrations.CreatedAtUnknown+"'")

	st, err := ReadStats(t.Context(), conn, decoder.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 1 || st[0].Due != 3 || st[0].OldestDueSeconds > 3600 {
		t.Fatalf("stats with two rows of unknown time and one new: %+v, want 3 due and the new row's age", st)
	}

	rows, _, err := tb.claim(t.Context(), conn, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 {
		t.Fatalf("claimed %d rows, want 3", len(rows))
	}
	for _, r := range rows {
		old := r.id == ids["old-0"] || r.id == ids["old-1"]
		switch {
		case old && !r.e.CommitTime.IsZero():
			t.Errorf("a row of unknown time has the time %s", r.e.CommitTime.UTC())
		case !old && time.Since(r.e.CommitTime) > time.Hour:
			t.Errorf("the new row has the time %s, want its created_at", r.e.CommitTime.UTC())
		}
	}
}
