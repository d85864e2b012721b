package poll

import (
	"strings"
	"testing"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/migrations"
)

// TestInvalidIndexRefused: an INVALID poll index (what a failed CREATE
// INDEX CONCURRENTLY leaves, which re-running it with IF NOT EXISTS keeps;
// the planner does not use it) fails CheckTable, which names DROP INDEX
// CONCURRENTLY then the build; migrate --poll on a small table drops and
// rebuilds it, and the table passes.
func TestInvalidIndexRefused(t *testing.T) {
	conn, _ := claimFixture(t, Config{Ordering: OrderAggregate})
	ctx := t.Context()
	l := decoder.Config{}.WithDefaults().Layouts()[0]
	n := migrations.PollNamesOf(l)
	// The state a cut concurrent build leaves, without racing a timeout.
	if _, err := conn.Exec(ctx, "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass($1)", n.DueIndex); err != nil {
		t.Fatal(err)
	}
	err := CheckTable(ctx, conn, l)
	if err == nil {
		t.Fatalf("index %s is INVALID, and CheckTable accepts the table", n.DueIndex)
	}
	drop, build := strings.Index(err.Error(), "DROP INDEX CONCURRENTLY IF EXISTS \"public\".\""+n.DueIndex+"\""), strings.Index(err.Error(), "CREATE INDEX CONCURRENTLY IF NOT EXISTS \""+n.DueIndex+"\"")
	if drop < 0 || build < drop {
		t.Fatalf("CheckTable: %v; want DROP INDEX CONCURRENTLY then the build named", err)
	}
	res, err := migrations.ApplyPoll(ctx, conn, decoder.Config{})
	if err != nil || len(res.Unbuilt) != 0 {
		t.Fatalf("migrate --poll: %v, unbuilt %v", err, res.Unbuilt)
	}
	var valid bool
	if err := conn.QueryRow(ctx, "SELECT indisvalid AND indisready FROM pg_index WHERE indexrelid = to_regclass($1)", n.DueIndex).Scan(&valid); err != nil {
		t.Fatal(err)
	}
	if !valid {
		t.Fatalf("index %s still INVALID after migrate --poll", n.DueIndex)
	}
	if err := CheckTable(ctx, conn, l); err != nil {
		t.Fatal(err)
	}
}
