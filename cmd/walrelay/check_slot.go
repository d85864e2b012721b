package main

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/cmd/walrelay/internal/admin"
	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/replication"
)

// checkInactiveSlots warns of each slot of the server that no process
// streams, with the WAL it keeps (from its restart_lsn to the current WAL
// position): a slot left behind (by a tool, a test, a first start of an
// older walrelay that failed) keeps WAL until the disk fills unless
// max_slot_wal_keep_size bounds it. slot is walrelay's own, which is
// inactive whenever walrelay is stopped: its line is ok, with its size,
// unless no transaction was ever streamed from it (a first start that
// created it and failed): then it is a warning.
func checkInactiveSlots(ctx context.Context, conn *pgx.Conn, slot string, add func(check, status, format string, args ...any)) {
	fresh := neverStreamed(ctx, conn, slot)
	rows, err := conn.Query(ctx, `SELECT slot_name, slot_type, coalesce(database, ''),
		coalesce(pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END, restart_lsn), 0)::bigint
		FROM pg_replication_slots WHERE NOT active ORDER BY 4 DESC, 1`)
	if err != nil {
		add("inactive slots", "warn", "cannot read pg_replication_slots: %v", err)
		return
	}
	var name, typ, db string
	var retained int64
	n := 0
	_, err = pgx.ForEachRow(rows, []any{&name, &typ, &db, &retained}, func() error {
		n++
		where := typ
		if db != "" {
			where += ", database " + db
		}
		if name == slot {
			if fresh {
				add("inactive slot "+name, "warn", "walrelay's slot, and no transaction was ever streamed from it since it was created (pg_stat_replication_slots; or since its statistics were reset): "+
					"it holds %s of WAL (%s). A first start that created it and then failed leaves it so (its log says why): fix that and start walrelay again, nothing is lost. "+
					"If walrelay will not run with this slot, reconcile the rows committed since its creation (walrelay reconcile --since TIME --replay --yes), then drop it: walrelay slot drop %s --yes",
					admin.HumanBytes(retained), where, name)
				return nil
			}
			add("inactive slot "+name, "ok", "walrelay's slot, not streamed now: it holds %s of WAL (%s) until a walrelay streams it",
				admin.HumanBytes(retained), where)
			return nil
		}
		if typ == "physical" {
			add("inactive slot "+name, "warn", "holds %s of WAL (physical: a standby's, or a backup tool's) and no standby streams it now: check the standby that uses it (its primary_slot_name); "+
				"only if that standby is gone for good, drop it with SELECT pg_drop_replication_slot('%s') (a standby whose slot is dropped may need a new base backup; walrelay slot drop handles logical slots only)",
				admin.HumanBytes(retained), name)
			return nil
		}
		add("inactive slot "+name, "warn", "holds %s of WAL (%s) and no process streams it: if nothing will, drop it (walrelay slot drop %s, or SELECT pg_drop_replication_slot('%s'))",
			admin.HumanBytes(retained), where, name, name)
		return nil
	})
	if err != nil {
		add("inactive slots", "warn", "cannot read pg_replication_slots: %v", err)
		return
	}
	if n == 0 {
		add("inactive slots", "ok", "none: every slot is streamed")
	}
}

// neverStreamed reports whether no transaction was ever decoded from slot
// since it was created or its statistics were reset (PostgreSQL 14 and
// later: pg_stat_replication_slots; false when that cannot be read).
func neverStreamed(ctx context.Context, conn *pgx.Conn, slot string) bool {
	var txns int64
	err := conn.QueryRow(ctx, "SELECT total_txns FROM pg_stat_replication_slots WHERE slot_name = $1", slot).Scan(&txns)
	return err == nil && txns == 0
}

// checkFailover adds what a database failover would do to the slot: from
// PostgreSQL 17, whether it is marked for failover, whether the primary
// holds logical changes back for its standbys (synchronized_standby_slots),
// and whether each standby that postgres.dsn names has a synchronized copy.
func checkFailover(ctx context.Context, conn *pgx.Conn, cfg *config.Config, add func(name, status, format string, args ...any)) {
	const name = "slot failover"
	slot := cfg.Postgres.Slot
	v, err := replication.ServerVersion(ctx, conn)
	if err != nil {
		add(name, "fail", "%v", err)
		return
	}
	if v < 17 {
		if cfg.Postgres.SlotFailover {
			add(name, "fail", "postgres.slot_failover needs PostgreSQL 17 or later; this server is PostgreSQL %d: a failover to a standby loses the slot", v)
		}
		return
	}
	marked, err := replication.FailoverMarked(ctx, conn, slot)
	switch {
	case errors.Is(err, replication.ErrSlotMissing):
		return // the slot line says it
	case err != nil:
		add(name, "fail", "%v", err)
		return
	case !marked && cfg.Postgres.SlotFailover:
		add(name, "warn", "slot %s is not marked for failover yet: walrelay run marks it at start (postgres.slot_failover)", slot)
		return
	case !marked:
		var standbys int
		_ = conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots s WHERE s.active_pid = pg_stat_replication.pid AND s.slot_type = 'logical')").Scan(&standbys)
		if standbys > 0 {
			add(name, "warn", "slot %s is not marked for failover and %d standby(s) replicate from this server: promoting one loses the slot and stops walrelay; set postgres.slot_failover=true", slot, standbys)
		}
		return
	}
	var sync string
	_ = conn.QueryRow(ctx, "SELECT current_setting('synchronized_standby_slots')").Scan(&sync)
	if sync == "" {
		add(name, "warn", "slot %s is marked for failover, but synchronized_standby_slots is empty: walrelay may publish a transaction that a standby has not received, "+
			"which a failover to it loses; ALTER SYSTEM SET synchronized_standby_slots = '<the standbys' physical slots>' and SELECT pg_reload_conf()", slot)
	} else {
		add(name, "ok", "slot %s is marked for failover; logical changes wait for the standbys of synchronized_standby_slots (%s)", slot, sync)
	}
	seen := 0
	for _, c := range replication.StandbyCopies(ctx, conn.Config(), slot) {
		switch {
		case c.Err != nil:
			add("standby "+c.Host, "warn", "could not read its copy of slot %s: %v", slot, c.Err)
		case !c.Standby:
		case c.Synced:
			seen++
			add("standby "+c.Host, "ok", "holds a synchronized copy of slot %s (confirmed %s): a failover to it keeps the slot", slot, c.ConfirmedFlush)
		default:
			seen++
			add("standby "+c.Host, "warn", "holds no synchronized copy of slot %s yet: a failover to it now would lose the slot "+
				"(the standby needs sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name, and dbname in primary_conninfo)", slot)
		}
	}
	if seen == 0 {
		add(name, "ok", "postgres.dsn names no standby: list them as further hosts (host1:5432,host2:5432, with target_session_attrs=read-write) for check to verify their copies and walrelay to follow a failover")
	}
}
