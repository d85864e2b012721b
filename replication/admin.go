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
		if err := CheckTableOwner(ctx, conn, schema, table); err != nil {
			return false, fmt.Errorf("create publication %s: %w", pub, err)
		}
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

// SlotStatus is one logical slot as an operator sees it: pg_replication_slots
// and the server's current WAL position.
type SlotStatus struct {
	SlotName          string  `json:"slot_name"`
	Plugin            string  `json:"plugin"`
	Database          string  `json:"database"`
	Active            bool    `json:"active"`
	ActivePID         *int    `json:"active_pid"`
	RestartLSN        *string `json:"restart_lsn"`
	ConfirmedFlushLSN *string `json:"confirmed_flush_lsn"`
	CurrentWALLSN     string  `json:"current_wal_lsn"`
	RetainedWALBytes  *int64  `json:"retained_wal_bytes"` // current WAL LSN minus restart_lsn
	LagBytes          *int64  `json:"lag_bytes"`          // current WAL LSN minus confirmed_flush_lsn
	WALStatus         *string `json:"wal_status"`
	SafeWALSize       *int64  `json:"safe_wal_size"`  // NULL: max_slot_wal_keep_size is unlimited
	InactiveSince     *string `json:"inactive_since"` // PostgreSQL 17 and later
}

// Slots lists the logical slots, or only the one named if name is not empty.
func Slots(ctx context.Context, conn *pgx.Conn, name string) ([]SlotStatus, error) {
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return nil, fmt.Errorf("read server version: %w", err)
	}
	inactive := "NULL::text"
	if version >= 170000 {
		inactive = "inactive_since::text"
	}
	rows, err := conn.Query(ctx, `SELECT slot_name::text, coalesce(plugin::text, ''), coalesce(database::text, ''), active, active_pid,
		restart_lsn::text, confirmed_flush_lsn::text, cur::text,
		(cur - restart_lsn)::bigint, (cur - confirmed_flush_lsn)::bigint, wal_status, safe_wal_size, `+inactive+`
		FROM pg_replication_slots, (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS cur) c
		WHERE slot_type = 'logical' AND ($1 = '' OR slot_name = $1) ORDER BY slot_name`, name)
	if err != nil {
		return nil, fmt.Errorf("read pg_replication_slots: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SlotStatus, error) {
		var s SlotStatus
		err := r.Scan(&s.SlotName, &s.Plugin, &s.Database, &s.Active, &s.ActivePID, &s.RestartLSN, &s.ConfirmedFlushLSN, &s.CurrentWALLSN,
			&s.RetainedWALBytes, &s.LagBytes, &s.WALStatus, &s.SafeWALSize, &s.InactiveSince)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("read pg_replication_slots: %w", err)
	}
	if name != "" && len(out) == 0 {
		return nil, fmt.Errorf("slot %s: %w", name, ErrSlotMissing)
	}
	return out, nil
}

// DropSlot drops a slot that no process streams.
func DropSlot(ctx context.Context, conn *pgx.Conn, name string) error {
	st, err := Slots(ctx, conn, name)
	if err != nil {
		return err
	}
	if st[0].Active {
		return fmt.Errorf("slot %s is active in process %d: stop that walrelay first", name, deref(st[0].ActivePID))
	}
	if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", name); err != nil {
		return fmt.Errorf("drop slot %s: %w", name, err)
	}
	return nil
}

// AdvanceSlot moves a stopped slot's confirmed position forward to to,
// skipping every event before it, and returns where it was and where it is.
// It refuses an active slot and a move backwards. With dryRun it checks and
// reports without moving (now is then to).
func AdvanceSlot(ctx context.Context, conn *pgx.Conn, name string, to pglogrepl.LSN, dryRun bool) (from, now pglogrepl.LSN, err error) {
	st, err := Slots(ctx, conn, name)
	if err != nil {
		return 0, 0, err
	}
	s := st[0]
	if s.Active {
		return 0, 0, fmt.Errorf("slot %s is active in process %d: stop that walrelay before moving its position", name, deref(s.ActivePID))
	}
	if s.ConfirmedFlushLSN == nil {
		return 0, 0, fmt.Errorf("slot %s has no confirmed position", name)
	}
	if from, err = pglogrepl.ParseLSN(*s.ConfirmedFlushLSN); err != nil {
		return 0, 0, err
	}
	if to < from {
		return from, from, fmt.Errorf("slot %s is at %s: a slot cannot move back to %s", name, from, to)
	}
	if dryRun {
		return from, to, nil
	}
	var end string
	if err := conn.QueryRow(ctx, "SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::text::pg_lsn)", name, to.String()).Scan(&end); err != nil {
		return from, from, fmt.Errorf("advance slot %s to %s: %w", name, to, err)
	}
	now, err = pglogrepl.ParseLSN(end)
	return from, now, err
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// PublicationInfo is a publication and what it covers.
type PublicationInfo struct {
	Name      string   `json:"name"`
	AllTables bool     `json:"all_tables"`
	Publish   []string `json:"publish"` // insert, update, delete, truncate
	Tables    []string `json:"tables"`  // schema.table
}

// ErrPublicationMissing is wrapped when the publication does not exist.
var ErrPublicationMissing = errors.New("publication does not exist")

// Publication describes the publication name.
func Publication(ctx context.Context, conn *pgx.Conn, name string) (PublicationInfo, error) {
	p := PublicationInfo{Name: name, Tables: []string{}}
	var ins, upd, del, trunc bool
	err := conn.QueryRow(ctx, "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1", name).
		Scan(&p.AllTables, &ins, &upd, &del, &trunc)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, fmt.Errorf("publication %s: %w", name, ErrPublicationMissing)
	}
	if err != nil {
		return p, fmt.Errorf("read publication %s: %w", name, err)
	}
	for _, x := range []struct {
		on   bool
		name string
	}{{ins, "insert"}, {upd, "update"}, {del, "delete"}, {trunc, "truncate"}} {
		if x.on {
			p.Publish = append(p.Publish, x.name)
		}
	}
	rows, err := conn.Query(ctx, "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1", name)
	if err != nil {
		return p, fmt.Errorf("read tables of publication %s: %w", name, err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return p, fmt.Errorf("read tables of publication %s: %w", name, err)
	}
	p.Tables = append(p.Tables, tables...)
	return p, nil
}

// CheckTableOwner returns an error naming the missing privilege when the
// current role may not add schema.table to a publication (it must own the
// table, or be a member of its owner, or be superuser).
func CheckTableOwner(ctx context.Context, conn *pgx.Conn, schema, table string) error {
	var owner, me string
	var ok bool
	err := conn.QueryRow(ctx, `SELECT pg_get_userbyid(c.relowner), current_user,
		pg_has_role(current_user, c.relowner, 'USAGE') OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
		FROM pg_class c WHERE c.oid = to_regclass($1)`, pgx.Identifier{schema, table}.Sanitize()).Scan(&owner, &me, &ok)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("table %s.%s does not exist", schema, table)
	}
	if err != nil {
		return fmt.Errorf("read owner of %s.%s: %w", schema, table, err)
	}
	if !ok {
		return fmt.Errorf("role %s does not own table %s.%s (its owner is %s): a publication needs the table's owner; run it as %s, or GRANT %s TO %s",
			me, schema, table, owner, owner, owner, me)
	}
	return nil
}

// DropPublication drops the publication.
func DropPublication(ctx context.Context, conn *pgx.Conn, name string) error {
	if _, err := Publication(ctx, conn, name); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "DROP PUBLICATION "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("drop publication %s: %w", name, err)
	}
	return nil
}
