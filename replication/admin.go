package replication

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

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
		return SlotInfo{}, &FatalError{fmt.Errorf("slot %s: %w: it was dropped while walrelay ran; rows committed after its last confirmed position "+
			"are no longer in the WAL stream. To go on: walrelay slot create %s (it starts now), then republish from the outbox table the rows "+
			"committed since the last event on the topic", slot, ErrSlotMissing, slot)}
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
		if plugin != "pgoutput" || db != cur {
			return false, fmt.Errorf("slot %s exists with plugin %q in database %q; walrelay needs pgoutput in %q", slot, plugin, db, cur)
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
				"then republish from the outbox table the rows committed since the last event on the topic",
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

// recordSlot adds slot to pub's comment. It is best effort: the role may
// not own the publication (SlotRecorded then tells).
func recordSlot(ctx context.Context, conn *pgx.Conn, pub, slot string) {
	comment, exists, err := publicationComment(ctx, conn, pub)
	if pub == "" || err != nil || !exists {
		return
	}
	slots, rest := recordedSlots(comment)
	if slices.Contains(slots, slot) {
		return
	}
	slots = append(slots, slot)
	text := strings.Join(append(rest, slotMarker+strings.Join(slots, ", ")), "\n")
	_, _ = conn.Exec(ctx, "COMMENT ON PUBLICATION "+pgx.Identifier{pub}.Sanitize()+" IS "+quoteLiteral(text))
}

var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// ident renders a possibly qualified name for an SQL statement that an
// error suggests: each part quoted only where it must be.
func ident(parts ...string) string {
	for i, p := range parts {
		if !plainIdent.MatchString(p) {
			parts[i] = pgx.Identifier{p}.Sanitize()
		}
	}
	return strings.Join(parts, ".")
}

// quoteLiteral quotes s as an SQL string literal (standard_conforming_strings
// is on from PostgreSQL 9.1).
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// ValidPublicationName reports whether s is usable as a publication name:
// any identifier of 1 to 63 bytes without a NUL (it is quoted wherever it
// is used, so case and punctuation are kept).
func ValidPublicationName(s string) bool {
	return len(s) >= 1 && len(s) <= 63 && !strings.ContainsRune(s, 0)
}

// Outbox is what walrelay's publication must publish: the outbox table
// alone, its inserts, every column walrelay reads.
type Outbox struct {
	Publication   string
	Schema, Table string
	// Columns are the columns walrelay reads: a column list of the
	// publication must keep each.
	Columns []string
	// AllowRowFilter accepts a row filter on the table: a shard of a
	// sharded outbox (every row must then match another shard's filter).
	// A row filter drops the rows it does not match, unpublished.
	AllowRowFilter bool
}

// EnsurePublication creates the publication for the outbox table with
// publish = 'insert' and publish_via_partition_root = true unless it
// exists. An existing publication must pass CheckPublication.
func EnsurePublication(ctx context.Context, conn *pgx.Conn, o Outbox) (created bool, err error) {
	if !ValidPublicationName(o.Publication) {
		return false, fmt.Errorf("publication name %q: want 1 to 63 bytes", o.Publication)
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", o.Publication).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up publication %s: %w", o.Publication, err)
	}
	if !exists {
		if err := CheckTableOwner(ctx, conn, o.Schema, o.Table); err != nil {
			return false, fmt.Errorf("create publication %s: %w", o.Publication, err)
		}
		// Via the root: a partitioned outbox's rows then come as the
		// root's, whatever partition they went to, attached later too.
		sql := "CREATE PUBLICATION " + pgx.Identifier{o.Publication}.Sanitize() + " FOR TABLE " + pgx.Identifier{o.Schema, o.Table}.Sanitize() +
			" WITH (publish = 'insert', publish_via_partition_root = true)"
		_, err = conn.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" {
			return EnsurePublication(ctx, conn, o)
		}
		if err != nil {
			return false, fmt.Errorf("create publication %s for %s.%s: %w", o.Publication, o.Schema, o.Table, err)
		}
		return true, nil
	}
	problems, err := CheckPublication(ctx, conn, o)
	if err != nil {
		return false, err
	}
	if len(problems) > 0 {
		return false, fmt.Errorf("publication %s: %s", o.Publication, strings.Join(problems, "; "))
	}
	return false, nil
}

// CheckPublication lists what in an existing publication could let a row of
// the outbox pass unpublished, each with the statement that fixes it: it
// does not publish inserts, publishes other tables (FOR ALL TABLES, a
// schema, a table added by hand: their Relation messages would stop the
// stream), does not cover the outbox, publishes a partitioned outbox under
// its partitions' names, filters rows (unless AllowRowFilter), or leaves out
// a column walrelay reads.
func CheckPublication(ctx context.Context, conn *pgx.Conn, o Outbox) ([]string, error) {
	p, err := Publication(ctx, conn, o.Publication)
	if err != nil {
		return nil, err
	}
	name := ident(o.Publication)
	qualified := ident(o.Schema, o.Table)
	var problems []string
	if !slices.Contains(p.Publish, "insert") {
		ops := strings.Join(append(slices.Clone(p.Publish), "insert"), ", ")
		problems = append(problems, fmt.Sprintf("it does not publish inserts: ALTER PUBLICATION %s SET (publish = '%s')", name, ops))
	}
	if p.AllTables {
		problems = append(problems, "it publishes every table (FOR ALL TABLES): give walrelay a publication of the outbox alone (walrelay publication create NAME, then postgres.publication)")
	}
	var schemas []string
	rows, err := conn.Query(ctx, "SELECT n.nspname::text FROM pg_publication_namespace pn JOIN pg_namespace n ON n.oid = pn.pnnspid JOIN pg_publication p ON p.oid = pn.pnpubid WHERE p.pubname = $1 ORDER BY 1", o.Publication)
	if err == nil {
		schemas, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return nil, fmt.Errorf("read schemas of publication %s: %w", o.Publication, err)
	}
	if len(schemas) > 0 {
		problems = append(problems, fmt.Sprintf("it publishes every table of schema %s: give walrelay a publication of the outbox alone (walrelay publication create NAME, then postgres.publication)", strings.Join(schemas, ", ")))
	}
	type member struct {
		rel      string
		outbox   bool
		filter   bool
		colsKept []string // nil: every column
	}
	rows, err = conn.Query(ctx, `SELECT r.prrelid::regclass::text, r.prrelid = to_regclass($2), r.prqual IS NOT NULL,
		CASE WHEN r.prattrs IS NULL THEN NULL ELSE (SELECT array_agg(a.attname::text) FROM pg_attribute a WHERE a.attrelid = r.prrelid AND a.attnum = ANY (r.prattrs)) END
		FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid WHERE p.pubname = $1 ORDER BY 1`, o.Publication, pgx.Identifier{o.Schema, o.Table}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("read tables of publication %s: %w", o.Publication, err)
	}
	var members []member
	var m member
	if _, err := pgx.ForEachRow(rows, []any{&m.rel, &m.outbox, &m.filter, &m.colsKept}, func() error {
		members = append(members, m)
		m.colsKept = nil
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read tables of publication %s: %w", o.Publication, err)
	}
	covered := false
	for _, m := range members {
		if !m.outbox {
			problems = append(problems, fmt.Sprintf("it publishes %s, which is not the outbox: ALTER PUBLICATION %s DROP TABLE %s", m.rel, name, m.rel))
			continue
		}
		covered = true
		if m.filter && !o.AllowRowFilter {
			problems = append(problems, fmt.Sprintf("it filters the rows of %s (a row filter): the rows it leaves out are never published. "+
				"For a shard of a sharded outbox set postgres.allow_row_filter=true; otherwise ALTER PUBLICATION %s SET TABLE %s", qualified, name, qualified))
		}
		if m.colsKept != nil {
			var missing []string
			for _, c := range o.Columns {
				if !slices.Contains(m.colsKept, c) {
					missing = append(missing, c)
				}
			}
			if len(missing) > 0 {
				problems = append(problems, fmt.Sprintf("its column list leaves out %s, which walrelay reads: ALTER PUBLICATION %s SET TABLE %s", strings.Join(missing, ", "), name, qualified))
			}
		}
	}
	if !covered && !p.AllTables && len(schemas) == 0 {
		problems = append(problems, fmt.Sprintf("it does not publish the outbox %s.%s: ALTER PUBLICATION %s ADD TABLE %s", o.Schema, o.Table, name, qualified))
	}
	var partitioned bool
	if err := conn.QueryRow(ctx, "SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)", pgx.Identifier{o.Schema, o.Table}.Sanitize()).Scan(&partitioned); err != nil {
		return nil, fmt.Errorf("read the kind of %s: %w", qualified, err)
	}
	if partitioned && !p.ViaRoot {
		problems = append(problems, fmt.Sprintf("the outbox is partitioned and the publication sends its rows under each partition's name: ALTER PUBLICATION %s SET (publish_via_partition_root = true)", name))
	}
	unlogged, err := UnloggedPartitions(ctx, conn, o.Schema, o.Table)
	if err != nil {
		return nil, err
	}
	problems = append(problems, unlogged...)
	return problems, nil
}

// UnloggedPartitions lists, each with the statement that fixes it, the
// partitions of the outbox that are UNLOGGED: their rows are never written
// to the WAL, so never published. PostgreSQL refuses an unlogged table in a
// publication, but not an unlogged partition of a published partitioned
// table (created so, attached, or set so later).
func UnloggedPartitions(ctx context.Context, conn *pgx.Conn, schema, table string) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT t.relid::regclass::text FROM pg_partition_tree(to_regclass($1)) t
		JOIN pg_class c ON c.oid = t.relid WHERE c.relpersistence = 'u' ORDER BY 1`, pgx.Identifier{schema, table}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("read the partitions of %s.%s: %w", schema, table, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the partitions of %s.%s: %w", schema, table, err)
	}
	var problems []string
	for _, n := range names {
		problems = append(problems, fmt.Sprintf("partition %s of the outbox is UNLOGGED: its rows are not written to the WAL, so never published: ALTER TABLE %s SET LOGGED", n, n))
	}
	return problems, nil
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
	ViaRoot   bool     `json:"publish_via_partition_root"`
	Publish   []string `json:"publish"` // insert, update, delete, truncate
	Tables    []string `json:"tables"`  // schema.table
}

// ErrPublicationMissing is wrapped when the publication does not exist.
var ErrPublicationMissing = errors.New("publication does not exist")

// Publication describes the publication name.
func Publication(ctx context.Context, conn *pgx.Conn, name string) (PublicationInfo, error) {
	p := PublicationInfo{Name: name, Tables: []string{}}
	var ins, upd, del, trunc bool
	err := conn.QueryRow(ctx, "SELECT puballtables, pubviaroot, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1", name).
		Scan(&p.AllTables, &p.ViaRoot, &ins, &upd, &del, &trunc)
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
