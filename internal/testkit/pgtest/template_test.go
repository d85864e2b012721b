package pgtest

import (
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestServersHaveTheirOwnSystemIdentifier: servers copied from the template
// start, take writes and WAL, and each has a system identifier of its own
// (as with initdb), which pg_control and the WAL agree on (a start reads
// both; the restart, the segments written since).
func TestServersHaveTheirOwnSystemIdentifier(t *testing.T) {
	if _, err := FindBinDir(); err != nil && os.Getenv(EnvDSN) == "" {
		t.Skip("no PostgreSQL server binaries")
	}
	copies := templateCopies.Load()
	seen := map[string]bool{}
	for i := range 2 {
		s := Start(t)
		if s.External() {
			t.Skip("the server of " + EnvDSN + " is not made here")
		}
		conn, err := pgx.Connect(t.Context(), s.DSN)
		if err != nil {
			t.Fatal(err)
		}
		var id string
		if err := conn.QueryRow(t.Context(), "SELECT system_identifier::text FROM pg_control_system()").Scan(&id); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(t.Context(), "CREATE TABLE t AS SELECT generate_series(1, 10000) AS n; SELECT pg_switch_wal(); CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
		conn.Close(t.Context())
		if seen[id] {
			t.Fatalf("system identifier %s twice", id)
		}
		seen[id] = true
		if i == 0 {
			if err := s.Restart(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := templateCopies.Load() - copies; n != 2 && os.Getenv(EnvNoTemplate) == "" {
		t.Fatalf("%d of 2 servers copied from the template (the others ran initdb)", n)
	}
	t.Logf("system identifiers: %v", seen)
}
