package replication

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ServerVersion returns the server's major version (15, 16, …).
func ServerVersion(ctx context.Context, conn *pgx.Conn) (int, error) {
	var n int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&n); err != nil {
		return 0, fmt.Errorf("read server_version_num: %w", err)
	}
	return n / 10000, nil
}

// FailoverMarked reports whether slot is marked for failover: the failover
// column of pg_replication_slots, which only PostgreSQL 17+ has (callers
// check ServerVersion first).
func FailoverMarked(ctx context.Context, conn *pgx.Conn, slot string) (bool, error) {
	var marked bool
	err := conn.QueryRow(ctx, "SELECT failover FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&marked)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("slot %s: %w", slot, ErrSlotMissing)
	}
	if err != nil {
		return false, fmt.Errorf("read the failover flag of slot %s: %w", slot, err)
	}
	return marked, nil
}

// MarkFailover marks slot for failover unless it is (PostgreSQL 17+): a
// physical standby with sync_replication_slots = on then keeps a copy of it,
// which the standby can use once promoted. It sends ALTER_REPLICATION_SLOT
// on a replication connection of repl (pglogrepl has no such command), so
// the slot must not be in use. marked is false when it was marked already.
// repl is the connection's configuration (made a replication session here).
func MarkFailover(ctx context.Context, conn *pgx.Conn, repl *pgconn.Config, slot string) (marked bool, err error) {
	v, err := ServerVersion(ctx, conn)
	if err != nil {
		return false, err
	}
	if v < 17 {
		return false, fmt.Errorf("postgres.slot_failover needs PostgreSQL 17 or later (failover slots); this server is PostgreSQL %d", v)
	}
	if !ValidSlotName(slot) {
		return false, fmt.Errorf("slot name %q: use 1 to 63 lower-case letters, digits and underscores", slot)
	}
	already, err := FailoverMarked(ctx, conn, slot)
	if err != nil || already {
		return false, err
	}
	rc, err := pgconn.ConnectConfig(ctx, replicationSession(repl.Copy()))
	if err != nil {
		return false, fmt.Errorf("connect for replication to mark slot %s for failover: %w", slot, err)
	}
	defer rc.Close(context.Background())
	if _, err := rc.Exec(ctx, "ALTER_REPLICATION_SLOT "+slot+" ( FAILOVER true )").ReadAll(); err != nil {
		return false, fmt.Errorf("mark slot %s for failover: %w", slot, err)
	}
	return true, nil
}

// StandbyCopy is what one standby holds of a failover slot.
type StandbyCopy struct {
	Host string // host:port
	// Standby is false for a host that is not in recovery (the primary,
	// when the DSN lists it).
	Standby bool
	// Synced is true when the standby has a synchronized copy it keeps
	// after a promotion: synced and not temporary (a temporary copy waits
	// for the standby to catch up, and a promotion drops it).
	Synced         bool
	Exists         bool
	ConfirmedFlush string
	Err            error
}

// StandbyCopies connects to each host of cfg (its host and fallbacks in
// turn, whatever target_session_attrs says; cfg's credentials) and reads
// what the standbys among them hold of slot.
func StandbyCopies(ctx context.Context, cfg *pgx.ConnConfig, slot string) []StandbyCopy {
	hosts := []*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}
	hosts = append(hosts, cfg.Fallbacks...)
	var out []StandbyCopy
	for _, h := range hosts {
		one := cfg.Copy()
		one.Host, one.Port, one.TLSConfig, one.Fallbacks = h.Host, h.Port, h.TLSConfig, nil
		one.ValidateConnect = nil
		c := StandbyCopy{Host: net.JoinHostPort(h.Host, strconv.Itoa(int(h.Port)))}
		c.Standby, c.Exists, c.Synced, c.ConfirmedFlush, c.Err = standbyCopy(ctx, one, slot)
		out = append(out, c)
	}
	return out
}

func standbyCopy(ctx context.Context, cfg *pgx.ConnConfig, slot string) (standby, exists, synced bool, confirmed string, err error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return false, false, false, "", err
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby); err != nil || !standby {
		return standby, false, false, "", err
	}
	err = conn.QueryRow(ctx, "SELECT synced AND NOT temporary, coalesce(confirmed_flush_lsn::text, '') FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&synced, &confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return true, false, false, "", nil
	}
	return true, err == nil, synced, confirmed, err
}
