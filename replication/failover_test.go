package replication

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestTargetSessionAttrsOnReplication: target_session_attrs works on a
// replication connection (pgconn's own checks use the extended protocol,
// which replication refuses): read-write and primary reach the primary,
// standby and read-only are refused with the reason.
func TestTargetSessionAttrsOnReplication(t *testing.T) {
	t.Parallel()
	pg := streamed(t, 1)
	ctx := t.Context()
	sep := "?"
	if strings.Contains(pg.DSN, "?") {
		sep = "&"
	}
	for attrs, want := range map[string]string{"read-write": "", "primary": "", "any": "", "standby": "is not a standby", "read-only": "is not read-only"} {
		cfg, err := ReplicationConfig(pg.DSN + sep + "target_session_attrs=" + attrs)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := pgconn.ConnectConfig(ctx, cfg)
		if err == nil {
			_, err = identifySystem(ctx, conn)
			conn.Close(context.Background())
		}
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Fatalf("target_session_attrs=%s: %v, want %q", attrs, err, want)
		}
	}
}

// identifySystem proves the connection is a replication session.
func identifySystem(ctx context.Context, conn *pgconn.PgConn) (string, error) {
	res, err := conn.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll()
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 {
		return "", err
	}
	return string(res[0].Rows[0][0]), nil
}

// TestMarkFailover: on a server before 17, postgres.slot_failover is
// refused with the version named; from 17 the slot is marked once.
func TestMarkFailover(t *testing.T) {
	t.Parallel()
	pg := streamed(t, 1)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	v, err := ServerVersion(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	repl, err := pgconn.ParseConfig(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	marked, err := MarkFailover(ctx, conn, repl, "walrelay")
	if v < 17 {
		if err == nil || !strings.Contains(err.Error(), "needs PostgreSQL 17 or later") {
			t.Fatalf("PostgreSQL %d: %v", v, err)
		}
		return
	}
	if err != nil || !marked {
		t.Fatalf("mark: %v %v", marked, err)
	}
	if on, err := FailoverMarked(ctx, conn, "walrelay"); err != nil || !on {
		t.Fatalf("after marking: %v %v", on, err)
	}
	if marked, err := MarkFailover(ctx, conn, repl, "walrelay"); err != nil || marked {
		t.Fatalf("again: %v %v", marked, err)
	}
}
