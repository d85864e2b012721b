package main

import (
	"strings"
	"testing"

	"github.com/walrelay/walrelay/internal/testkit/pgtest"
)

// TestMigratePollExistingRows: migrate --poll over an outbox that holds
// rows (the WAL source's) is refused, naming --existing-rows sent and
// pending, and changes nothing; --existing-rows pending migrates it and
// says the rows are PENDING and how their ties were ordered.
func TestMigratePollExistingRows(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	e := env{"WALRELAY_POSTGRES_DSN": pg.DSN}
	mustRun(t, e, "migrate")
	conn := connect(t, pg.DSN)
	execSQL(t, conn, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) SELECT gen_random_uuid(), 'order', 'o-1', 'T', '{}' FROM generate_series(1, 3)`)
	code, out := runCmd(t, e, "migrate", "--poll")
	if code == 0 || !strings.Contains(out, "--existing-rows sent") || !strings.Contains(out, "--existing-rows pending") {
		t.Fatalf("migrate --poll over 3 rows, no --existing-rows: exit %d\n%s", code, out)
	}
	var has bool
	if err := conn.QueryRow(t.Context(), "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname = 'status')").Scan(&has); err != nil || has {
		t.Fatalf("the refused migration added status (%v)", err)
	}
	if code, out := runCmd(t, e, "migrate", "--poll", "--existing-rows", "pending"); code != 0 || !strings.Contains(out, "3 rows that were there are PENDING") {
		t.Fatalf("migrate --poll --existing-rows pending: exit %d\n%s", code, out)
	}
}
