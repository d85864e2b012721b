package replication

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/internal/testkit/pgtest"
)

// TestLateTablesAfterXidWraparound: TablesAddedAfterSlot
// compares age(pg_publication_rel.xmin) with age(catalog_xmin). Since
// PostgreSQL 9.4 a frozen row keeps its raw xmin, and age() is a 32-bit
// circular difference: once 2^31 transactions have passed since the
// publication was created (25 days at 1,000 transactions a second), the
// old row's age reads negative, and every outbox table is "added after
// the slot" on a healthy, long-running setup. The xid counter is moved
// with pg_resetwal to reach that point in a second. A negative age is
// taken as old (found by review; before: every table listed).
func TestLateTablesAfterXidWraparound(t *testing.T) {
	t.Parallel()
	pg, conn := serverConn(t)
	if pg.External() {
		t.Skip("needs a throwaway server")
	}
	ctx := t.Context()
	bin, err := pgtest.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(bin, "pg_resetwal")); err != nil {
		t.Skipf("needs pg_resetwal beside the server's binaries (%s has none: the npm builds of .ci/postgres)", bin)
	}
	ex := func(c *pgx.Conn, sql string) {
		t.Helper()
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	ex(conn, "CREATE SCHEMA ob; CREATE TABLE ob.outbox (id int PRIMARY KEY)")
	ex(conn, "CREATE PUBLICATION p FOR TABLE ob.outbox WITH (publish = 'insert')")
	ex(conn, "ALTER SYSTEM SET autovacuum = off")
	var data string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&data); err != nil {
		t.Fatal(err)
	}
	for _, db := range []string{"postgres", "template1"} {
		c, err := pgx.Connect(ctx, pg.DSNFor(db))
		if err != nil {
			t.Fatal(err)
		}
		ex(c, "VACUUM FREEZE")
		c.Close(ctx)
	}
	conn.Close(ctx)
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	const next = 0x80100000 // 2^31 + 2^20: more than 2^31 after the publication's xmin
	const oldest = 0x00400000
	seg := filepath.Join(data, "pg_xact", fmt.Sprintf("%04X", next/(32*32768)))
	if err := os.WriteFile(seg, make([]byte, 32*8192), 0o600); err != nil {
		t.Fatal(err)
	}
	argv := []string{filepath.Join(bin, "pg_resetwal"), "-x", fmt.Sprint(next), "-u", fmt.Sprint(oldest), "-D", data}
	if os.Getuid() == 0 {
		_ = exec.Command("chown", "postgres:postgres", seg).Run()
		argv = append([]string{"runuser", "-u", "postgres", "--"}, argv...)
	}
	if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("pg_resetwal: %v\n%s", err, out)
	}
	if err := pg.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err = pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	ex(conn, "SELECT pg_create_logical_replication_slot('w', 'pgoutput')")
	var relXmin, relAge, slotAge int64
	if err := conn.QueryRow(ctx, `SELECT r.xmin::text::bigint, age(r.xmin), age(s.catalog_xmin) FROM pg_publication_rel r, pg_replication_slots s
		WHERE s.slot_name = 'w'`).Scan(&relXmin, &relAge, &slotAge); err != nil {
		t.Fatal(err)
	}
	t.Logf("pg_publication_rel xmin %d age %d; slot catalog_xmin age %d", relXmin, relAge, slotAge)
	tables, err := TablesAddedAfterSlot(ctx, conn, "w", "p")
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) > 0 {
		t.Errorf("TablesAddedAfterSlot = %v for a publication created %d transactions before slot w: a false late-table warning at every start and in check", tables, next-relXmin)
	}
	behind, err := PublicationGap(ctx, conn, "w", "p")
	t.Logf("PublicationGap = %v, %v", behind, err)
}
