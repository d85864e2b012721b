package replication

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SlotInfo is a logical slot's row of pg_replication_slots.
type SlotInfo struct {
	Name           string
	Active         bool
	ActivePID      int
	RestartLSN     pglogrepl.LSN
	ConfirmedFlush pglogrepl.LSN
	WALStatus      string
}

// ErrSlotMissing is wrapped when the slot does not exist.
var ErrSlotMissing = errors.New("replication slot does not exist")

// inspectSlot reads the slot's state on a replication connection, which
// speaks only the simple query protocol; the name was validated by New.
func inspectSlot(ctx context.Context, conn *pgconn.PgConn, slot string) (SlotInfo, error) {
	res, err := conn.Exec(ctx, "SELECT active, coalesce(active_pid, 0), coalesce(restart_lsn, '0/0'), coalesce(confirmed_flush_lsn, '0/0'), "+
		"coalesce(wal_status, ''), database = current_database() FROM pg_replication_slots WHERE slot_name = '"+slot+"'").ReadAll()
	if err != nil {
		if isFatalPgError(err) {
			return SlotInfo{}, &FatalError{fmt.Errorf("inspect slot %s: %w", slot, err)}
		}
		return SlotInfo{}, fmt.Errorf("inspect slot %s: %w", slot, err)
	}
	if len(res) != 1 || len(res[0].Rows) == 0 {
		return SlotInfo{}, &FatalError{fmt.Errorf("slot %s: %w (create it with walrelay migrate, or let walrelay run create it)", slot, ErrSlotMissing)}
	}
	row := res[0].Rows[0]
	if string(row[5]) != "t" {
		return SlotInfo{}, &FatalError{fmt.Errorf("slot %s belongs to another database", slot)}
	}
	info := SlotInfo{Name: slot, Active: string(row[0]) == "t", WALStatus: string(row[4])}
	info.ActivePID, _ = strconv.Atoi(string(row[1]))
	if info.RestartLSN, err = pglogrepl.ParseLSN(string(row[2])); err != nil {
		return SlotInfo{}, fmt.Errorf("slot %s restart_lsn: %w", slot, err)
	}
	if info.ConfirmedFlush, err = pglogrepl.ParseLSN(string(row[3])); err != nil {
		return SlotInfo{}, fmt.Errorf("slot %s confirmed_flush_lsn: %w", slot, err)
	}
	return info, nil
}

// EnsureSlot creates the logical slot with the pgoutput plugin unless it
// exists. created is false when it existed (also when another process
// created it at the same moment). A slot with another plugin is an error.
func EnsureSlot(ctx context.Context, conn *pgx.Conn, slot string) (created bool, err error) {
	if !ValidSlotName(slot) {
		return false, fmt.Errorf("slot name %q: use 1 to 63 lower-case letters, digits and underscores", slot)
	}
	var plugin, db string
	err = conn.QueryRow(ctx, "SELECT coalesce(plugin, ''), coalesce(database, '') FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&plugin, &db)
	switch {
	case err == nil:
		var cur string
		if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&cur); err != nil {
			return false, fmt.Errorf("read current database: %w", err)
		}
		if plugin != "pgoutput" || db != cur {
			return false, fmt.Errorf("slot %s exists with plugin %q in database %q; walrelay needs pgoutput in %q", slot, plugin, db, cur)
		}
		return false, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return false, fmt.Errorf("look up slot %s: %w", slot, err)
	}
	_, err = conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // duplicate object: created meanwhile
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("create slot %s: %w", slot, err)
	}
	return true, nil
}

// EnsurePublication creates the publication for table (schema, name) with
// publish = 'insert' unless it exists. An existing publication must cover
// the table and publish inserts; otherwise the error says what to change.
func EnsurePublication(ctx context.Context, conn *pgx.Conn, pub, schema, table string) (created bool, err error) {
	if !ValidSlotName(pub) {
		return false, fmt.Errorf("publication name %q: use 1 to 63 lower-case letters, digits and underscores", pub)
	}
	var inserts bool
	err = conn.QueryRow(ctx, "SELECT pubinsert FROM pg_publication WHERE pubname = $1", pub).Scan(&inserts)
	if errors.Is(err, pgx.ErrNoRows) {
		sql := "CREATE PUBLICATION " + pgx.Identifier{pub}.Sanitize() + " FOR TABLE " + pgx.Identifier{schema, table}.Sanitize() + " WITH (publish = 'insert')"
		_, err = conn.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" {
			return EnsurePublication(ctx, conn, pub, schema, table)
		}
		if err != nil {
			return false, fmt.Errorf("create publication %s for %s.%s: %w", pub, schema, table, err)
		}
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up publication %s: %w", pub, err)
	}
	if !inserts {
		return false, fmt.Errorf("publication %s does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", pub, pub)
	}
	var covered bool
	err = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3)", pub, schema, table).Scan(&covered)
	if err != nil {
		return false, fmt.Errorf("read tables of publication %s: %w", pub, err)
	}
	if !covered {
		return false, fmt.Errorf("publication %s does not cover table %s.%s: ALTER PUBLICATION %s ADD TABLE %s", pub, schema, table, pub, pgx.Identifier{schema, table}.Sanitize())
	}
	return false, nil
}
