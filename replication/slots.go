package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/sqlquote"
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
		"coalesce(wal_status, ''), database = current_database(), coalesce(database, ''), current_database() FROM pg_replication_slots WHERE slot_name = "+sqlquote.Literal(slot)).ReadAll()
	if err != nil {
		if isFatalPgError(err) {
			return SlotInfo{}, failure.Mark(failure.Fatal, fmt.Errorf("inspect slot %s: %w", slot, err))
		}
		return SlotInfo{}, fmt.Errorf("inspect slot %s: %w", slot, err)
	}
	if len(res) != 1 || len(res[0].Rows) == 0 {
		return SlotInfo{}, failure.Mark(failure.Fatal, fmt.Errorf("slot %s: %w: it was dropped while walrelay ran, or the server is a promoted standby that has no copy of it "+
			"(a failover: see postgres.slot_failover); rows committed after its last confirmed position are no longer in the WAL stream. To go on: walrelay slot create %s (it starts now), then walrelay reconcile --since <a time before the drop> (--all on a table without created_at, outbox.timestamp_column or only UUIDv7 ids; walrelay migrate adds created_at) "+
			"--replay --yes republishes the rows missing from the topics (docs/operations.md: \"The slot was lost or dropped\")", slot, ErrSlotMissing, slot))
	}
	row := res[0].Rows[0]
	if string(row[5]) != "t" {
		return SlotInfo{}, failure.Mark(failure.Fatal, SlotOfAnotherDatabase(slot, string(row[6]), string(row[7])))
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

// SlotOfAnotherDatabase is the error for a slot name that another database
// of the cluster uses: slot names are the cluster's, a slot streams one
// database.
func SlotOfAnotherDatabase(slot, db, current string) error {
	return fmt.Errorf("slot %s is the slot of database %q, not of %q: a cluster's databases share one namespace of slot names, and a slot streams one database; "+
		"give this database's walrelay a slot of its own with postgres.slot (WALRELAY_POSTGRES_SLOT), for example walrelay_%s", slot, db, current, slotSuffix(current))
}

// CheckSlotOwner returns SlotOfAnotherDatabase's error if slot exists in
// another database than conn's, else nil.
func CheckSlotOwner(ctx context.Context, conn *pgx.Conn, slot string) error {
	var db, cur string
	err := conn.QueryRow(ctx, "SELECT coalesce(database, ''), current_database() FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&db, &cur)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("look up slot %s: %w", slot, err)
	case db != cur:
		return SlotOfAnotherDatabase(slot, db, cur)
	}
	return nil
}

// slotSuffix makes a database name usable in a slot name.
func slotSuffix(db string) string {
	b := []byte(strings.ToLower(db))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}

// ErrSlotDropped is wrapped when a slot that walrelay created (and recorded
// on its publication) is gone: creating it again would start after the gap.
var ErrSlotDropped = errors.New("the replication slot was dropped")

// slotMarker starts the line of a publication's comment that lists the
// slots walrelay created for it. The comment is how walrelay knows, with no
// table of its own, that a missing slot existed before: a dropped slot is a
// gap in the stream, a slot never created is a first start.
const slotMarker = "walrelay slots: "

// EnsureSlot creates the logical slot with the pgoutput plugin unless it
// exists, and records it in the comment of publication pub (if pub is not
// empty). created is false when it existed (also when another process
// created it at the same moment). A slot with another plugin is an error.
// A slot that pub's comment records and that is gone wraps ErrSlotDropped,
// unless recreate: the operator's explicit word (walrelay slot create).
// Recording needs the publication's owner; without it the slot is still
// created, and SlotRecorded says so.
func EnsureSlot(ctx context.Context, conn *pgx.Conn, slot, pub string, recreate bool) (created bool, err error) {
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
		if db != cur {
			return false, SlotOfAnotherDatabase(slot, db, cur)
		}
		if plugin != "pgoutput" {
			return false, fmt.Errorf("slot %s exists with plugin %q; walrelay needs pgoutput: give walrelay a slot of its own (postgres.slot)", slot, plugin)
		}
		recordSlot(ctx, conn, pub, slot) // a slot of an earlier version, or created by hand
		return false, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return false, fmt.Errorf("look up slot %s: %w", slot, err)
	}
	if !recreate {
		recorded, err := SlotRecorded(ctx, conn, pub, slot)
		if err != nil {
			return false, err
		}
		if recorded {
			return false, fmt.Errorf("slot %s: %w: walrelay created it (publication %s records it) and it is gone: dropped by hand, "+
				"invalidated and removed, or lost in a failover or a restore. Rows committed after its last confirmed position are no longer in the WAL stream, "+
				"and a new slot starts at the current end of the WAL. To go on: walrelay slot create %s (it starts now), "+
				"then walrelay reconcile --since <a time before the loss> (--all on a table without created_at, outbox.timestamp_column or only UUIDv7 ids; walrelay migrate adds created_at) --replay --yes republishes the rows missing from the topics (docs/operations.md: \"The slot was lost or dropped\")",
				slot, ErrSlotDropped, pub, slot)
		}
	}
	_, err = conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // duplicate object: created meanwhile
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("create slot %s: %w", slot, err)
	}
	recordSlot(ctx, conn, pub, slot)
	return true, nil
}

// publicationComment reads pub's comment; exists is false when there is no
// such publication.
func publicationComment(ctx context.Context, conn *pgx.Conn, pub string) (comment string, exists bool, err error) {
	err = conn.QueryRow(ctx, "SELECT coalesce(obj_description(oid, 'pg_publication'), '') FROM pg_publication WHERE pubname = $1", pub).Scan(&comment)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read the comment of publication %s: %w", pub, err)
	}
	return comment, true, nil
}

// recordedSlots splits a publication comment into the slots its marker line
// lists and the rest of the comment.
func recordedSlots(comment string) (slots []string, rest []string) {
	for _, line := range strings.Split(comment, "\n") {
		if list, ok := strings.CutPrefix(line, slotMarker); ok {
			for _, s := range strings.Split(list, ",") {
				if s = strings.TrimSpace(s); s != "" {
					slots = append(slots, s)
				}
			}
		} else if line != "" {
			rest = append(rest, line)
		}
	}
	return slots, rest
}

// SlotRecorded reports whether publication pub's comment records slot as
// created by walrelay.
func SlotRecorded(ctx context.Context, conn *pgx.Conn, pub, slot string) (bool, error) {
	if pub == "" {
		return false, nil
	}
	comment, _, err := publicationComment(ctx, conn, pub)
	if err != nil {
		return false, err
	}
	slots, _ := recordedSlots(comment)
	return slices.Contains(slots, slot), nil
}

// RecordSlot records on publication pub the logical slot of this database
// that walrelay is to stream with it, when that slot exists (a slot
// another reader made, as Debezium's, taken over): if it is then dropped
// (Debezium's slot.drop.on.stop=true), EnsureSlot says it is gone instead
// of creating a new one at the end of the WAL. recorded says whether pub's
// comment records it now (false when the slot does not exist, or the role
// does not own pub).
func RecordSlot(ctx context.Context, conn *pgx.Conn, pub, slot string) (recorded bool, err error) {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND slot_type = 'logical' AND database = current_database())", slot).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up slot %s: %w", slot, err)
	}
	if !exists {
		return false, nil
	}
	recordSlot(ctx, conn, pub, slot)
	return SlotRecorded(ctx, conn, pub, slot)
}

// recordSlot adds slot to pub's comment. It is best effort: the role may
// not own the publication (SlotRecorded then tells).
func recordSlot(ctx context.Context, conn *pgx.Conn, pub, slot string) {
	if pub == "" {
		return
	}
	comment, exists, err := publicationComment(ctx, conn, pub)
	if err != nil || !exists {
		return
	}
	slots, rest := recordedSlots(comment)
	if slices.Contains(slots, slot) {
		return
	}
	slots = append(slots, slot)
	text := strings.Join(append(rest, slotMarker+strings.Join(slots, ", ")), "\n")
	// COMMENT takes no parameter: the literal reads the same whatever the
	// session's standard_conforming_strings.
	_, _ = conn.Exec(ctx, "COMMENT ON PUBLICATION "+pgx.Identifier{pub}.Sanitize()+" IS "+sqlquote.Literal(text))
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
		var typ string
		if conn.QueryRow(ctx, "SELECT slot_type::text FROM pg_replication_slots WHERE slot_name = $1", name).Scan(&typ) == nil && typ == "physical" {
			return nil, fmt.Errorf("slot %s is a physical slot (a standby's, or a backup tool's), not a logical one: walrelay's slot commands handle logical slots only; "+
				"if the standby that uses it is gone for good, SELECT pg_drop_replication_slot('%s') drops it: %w", name, name, ErrSlotMissing)
		}
		return nil, fmt.Errorf("slot %s: %w", name, ErrSlotMissing)
	}
	return out, nil
}

// DropSlot drops a slot that no process streams and returns its state
// before the drop; with dryRun it checks and reports without dropping.
func DropSlot(ctx context.Context, conn *pgx.Conn, name string, dryRun bool) (SlotStatus, error) {
	st, err := Slots(ctx, conn, name)
	if err != nil {
		return SlotStatus{}, err
	}
	if st[0].Active {
		return st[0], fmt.Errorf("slot %s is in use: %s: stop that client first", name, SlotHolder(ctx, conn, deref(st[0].ActivePID)))
	}
	if dryRun {
		return st[0], nil
	}
	if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", name); err != nil {
		return st[0], fmt.Errorf("drop slot %s: %w", name, err)
	}
	return st[0], nil
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
		return 0, 0, fmt.Errorf("slot %s is in use: %s: stop that client before moving its position", name, SlotHolder(ctx, conn, deref(s.ActivePID)))
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

// SlotHolder says who streams a slot whose active_pid is pid: that pid is
// PostgreSQL's walsender process, not the client's; the client is named
// by its address and application_name (pg_stat_replication, else
// pg_stat_activity), e.g. "streamed by PostgreSQL's walsender pid 4242 for
// the client at 10.0.0.7:51234 (application_name walrelay, since …)".
func SlotHolder(ctx context.Context, conn *pgx.Conn, pid int) string {
	what := fmt.Sprintf("streamed by PostgreSQL's walsender pid %d", pid)
	// Without pg_read_all_stats, another role's session shows NULLs.
	var addr, app, since *string
	err := conn.QueryRow(ctx, `SELECT CASE WHEN client_port = -1 THEN 'a local socket' ELSE host(client_addr) || ':' || client_port END,
		nullif(application_name, ''), to_char(backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
		FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&addr, &app, &since)
	if err != nil {
		return what // the session ended meanwhile
	}
	if addr != nil {
		what += " for the client at " + *addr
	}
	var attrs []string
	if app != nil {
		attrs = append(attrs, "application_name "+*app)
	}
	if since != nil {
		attrs = append(attrs, "connected since "+*since)
	}
	if len(attrs) > 0 {
		what += " (" + strings.Join(attrs, ", ") + ")"
	}
	return what
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// SystemID returns the server's system identifier (IDENTIFY_SYSTEM), which
// a physical standby shares with its primary: it names the database's WAL
// history, whatever host serves it.
func SystemID(ctx context.Context, cfg *pgconn.Config) (string, error) {
	conn, err := pgconn.ConnectConfig(ctx, replicationSession(cfg.Copy()))
	if err != nil {
		return "", fmt.Errorf("connect for replication: %w", err)
	}
	defer conn.Close(context.Background())
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return "", fmt.Errorf("identify system: %w", err)
	}
	return sys.SystemID, nil
}
