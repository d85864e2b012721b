package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/replication"
	"github.com/walrelay/walrelay/sink/record"
)

// Column is an outbox column walrelay reads: the configuration key that
// names it, the role it plays (the Debezium column name, or "header") and
// its name in the table.
type Column struct{ Key, Role, Name string }

// Columns lists the columns walrelay reads from the outbox table of o
// (defaults filled in): the required ones, the header columns, then the
// partition, timestamp, trace and version columns that are configured.
func Columns(o decoder.Layout) []Column {
	o = o.WithDefaults()
	c := o.Columns
	cols := []Column{
		{"outbox.id_column", "id", c.ID}, {"outbox.aggregate_type_column", "aggregatetype", c.AggregateType},
		{"outbox.aggregate_id_column", "aggregateid", c.AggregateID}, {"outbox.type_column", "type", c.Type},
		{"outbox.payload_column", "payload", c.Payload},
	}
	for _, h := range o.HeaderColumns {
		cols = append(cols, Column{"outbox.header_columns", "header", h})
	}
	for _, x := range []Column{{"outbox.partition_column", "partition", o.PartitionColumn},
		{"outbox.timestamp_column", "timestamp", o.TimestampColumn}, {"outbox.trace_column", "trace", o.TraceColumn},
		{"outbox.version_column", "version", o.VersionColumn}} {
		if x.Name != "" {
			cols = append(cols, x)
		}
	}
	return cols
}

// columnNames is Columns' names.
func columnNames(o decoder.Layout) []string {
	var names []string
	for _, c := range Columns(o) {
		names = append(names, c.Name)
	}
	return names
}

// PublicationSpec is what the publication pub must publish for the outbox
// tables of o (see replication.CheckPublication).
func PublicationSpec(o decoder.Config, pub string, allowRowFilter bool) replication.Outbox {
	spec := replication.Outbox{Publication: pub, AllowRowFilter: allowRowFilter}
	for _, l := range o.Layouts() {
		spec.Tables = append(spec.Tables, replication.Table{Schema: l.Schema, Name: l.Table, Columns: columnNames(l)})
	}
	return spec
}

// ReplicationRole says whether the session's role may open a replication
// connection: the REPLICATION attribute, a superuser, or (Amazon RDS)
// membership of rds_replication.
func ReplicationRole(ctx context.Context, conn *pgx.Conn) (role string, ok bool, err error) {
	err = conn.QueryRow(ctx, `SELECT rolname, rolreplication OR rolsuper OR EXISTS (SELECT 1 FROM pg_roles r
		WHERE r.rolname = 'rds_replication' AND pg_has_role(current_user, r.oid, 'member'))
		FROM pg_roles WHERE rolname = current_user`).Scan(&role, &ok)
	if err != nil {
		return "", false, fmt.Errorf("read the role: %w", err)
	}
	return role, ok, nil
}

// CheckServer refuses a server walrelay cannot stream from, naming the
// fix: wal_level below logical, a role that may not replicate.
func CheckServer(ctx context.Context, conn *pgx.Conn) error {
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		return fmt.Errorf("the server has wal_level = %s: set wal_level = logical in postgresql.conf and restart it (or use source: poll, which needs no logical replication)", walLevel)
	}
	role, ok, err := ReplicationRole(ctx, conn)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("role %s lacks the REPLICATION attribute: ALTER ROLE %s REPLICATION", role, pgx.Identifier{role}.Sanitize())
	}
	return nil
}

// preflight checks the database before streaming, so that a mistake in the
// configuration is one clear line at start rather than a retry loop, creates
// what a first start needs, and returns the decoder's configuration with
// the outbox tables' oids.
func preflight(ctx context.Context, cfg *Config, log *slog.Logger) (decoder.Config, error) {
	dcfg := cfg.Outbox.WithDefaults()
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg.ConnConfig.Copy())
	if err != nil {
		return dcfg, fmt.Errorf("postgres.dsn: connect: %w", err)
	}
	defer conn.Close(context.Background())
	if err := CheckServer(cctx, conn); err != nil {
		return dcfg, err
	}
	if err := checkSlotSettings(cctx, conn, cfg); err != nil {
		return dcfg, err
	}
	// Layouts is a fresh slice with the defaults filled in: each table's
	// oid and payload nullability are written into it.
	layouts := dcfg.Layouts()
	for i := range layouts {
		l := &layouts[i]
		if err := CheckTable(cctx, conn, *l); err != nil {
			return dcfg, err
		}
		if err := CheckChildPrivileges(cctx, conn, *l); err != nil {
			return dcfg, err
		}
		if err := conn.QueryRow(cctx, `SELECT to_regclass($1)::oid, coalesce((SELECT attnotnull FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2), false)`,
			pgx.Identifier{l.Schema, l.Table}.Sanitize(), l.Columns.Payload).Scan(&l.RelationID, &l.PayloadNotNull); err != nil {
			return dcfg, fmt.Errorf("read the oid of %s: %w", l.Name(), err)
		}
		// The aggregate id column's type and nullability: its key's
		// schema in the avro and JSON key formats, as Debezium's.
		var aggIDType uint32
		var aggIDTypeName string
		var aggIDNotNull bool
		if err := conn.QueryRow(cctx, `SELECT atttypid, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2`,
			pgx.Identifier{l.Schema, l.Table}.Sanitize(), l.Columns.AggregateID).Scan(&aggIDType, &aggIDTypeName, &aggIDNotNull); err != nil {
			return dcfg, fmt.Errorf("read the type of %s.%s: %w", l.Name(), l.Columns.AggregateID, err)
		}
		l.AggregateIDNullable = !aggIDNotNull
		if err := record.CheckKeyColumn(cfg.Sink.KeyFormat, format.KeyColumn{Type: aggIDType, Nullable: !aggIDNotNull}); err != nil {
			return dcfg, fmt.Errorf("%s.%s (%s): %w", l.Name(), l.Columns.AggregateID, aggIDTypeName, err)
		}
	}
	dcfg.Layout, dcfg.More = layouts[0], layouts[1:]
	if err := CheckEmitFunction(cctx, conn, dcfg); err != nil {
		return dcfg, err
	}
	if err := CheckMessagePrivileges(cctx, conn, dcfg); err != nil {
		return dcfg, err
	}
	if dcfg.MessagesFrom, dcfg.XidNow, err = CheckMessageHorizon(cctx, conn, dcfg); err != nil {
		return dcfg, err
	}
	warnings, err := CheckMessageTableRules(cctx, conn, dcfg)
	if err != nil {
		return dcfg, err
	}
	for _, w := range warnings {
		log.Warn(w)
	}
	spec := PublicationSpec(dcfg, cfg.Publication, cfg.AllowRowFilter)
	if cfg.CreateSlot {
		// Created by prepareSlot, once every check has passed and the
		// brokers are known: a start that fails leaves no new slot holding
		// WAL. But never a publication behind a slot no one reads, and
		// never a stream of a slot behind its publication.
		if err := refusePublicationBehindSlot(cctx, conn, cfg); err != nil {
			return dcfg, err
		}
		if err := refusePublicationGap(ctx, conn, cfg, log); err != nil {
			return dcfg, err
		}
		return dcfg, nil
	}
	problems, err := replication.CheckPublication(cctx, conn, spec)
	if errors.Is(err, replication.ErrPublicationMissing) {
		return dcfg, fmt.Errorf("publication %s does not exist: run walrelay migrate, or set postgres.create_slot=true", cfg.Publication)
	}
	if err != nil {
		return dcfg, err
	}
	if len(problems) > 0 {
		return dcfg, fmt.Errorf("publication %s: %s", cfg.Publication, strings.Join(problems, "; "))
	}
	var slotOK bool
	if err := conn.QueryRow(cctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", cfg.Slot).Scan(&slotOK); err != nil {
		return dcfg, fmt.Errorf("look up slot %s: %w", cfg.Slot, err)
	}
	if !slotOK {
		return dcfg, fmt.Errorf("replication slot %s does not exist: run walrelay migrate, or set postgres.create_slot=true", cfg.Slot)
	}
	if err := refusePublicationGap(ctx, conn, cfg, log); err != nil {
		return dcfg, err
	}
	return dcfg, nil
}

// prepareSlot is the last step of a start, after preflight's checks and
// the first ping of the brokers (which may have found Kafka down, not
// misnamed): with CreateSlot it creates the publication and the
// slot if they are missing, then it marks the slot for failover if asked.
// Nothing that can fail for a reason of the configuration comes after it,
// so a start that fails does not leave a new slot behind holding WAL; and
// a slot walrelay created is never dropped by it (rows committed since are
// only in that slot's stream).
//
// A new slot starts at the end of the WAL when it is created: rows
// committed before are not in its stream; rows committed while walrelay
// then waits for Kafka are. walrelay migrate creates the slot before the application
// writes; walrelay replay sends rows written before.
//
// createdSlot says whether this start created the slot.
func prepareSlot(ctx context.Context, cfg *Config, dcfg decoder.Config, log *slog.Logger) (createdSlot bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg.ConnConfig.Copy())
	if err != nil {
		return false, fmt.Errorf("postgres.dsn: connect: %w", err)
	}
	defer conn.Close(context.Background())
	if cfg.CreateSlot {
		if createdSlot, err = createPublicationAndSlot(cctx, conn, cfg, PublicationSpec(dcfg, cfg.Publication, cfg.AllowRowFilter), log); err != nil {
			return createdSlot, err
		}
	}
	return createdSlot, markFailover(cctx, conn, cfg, log)
}

// leftSlot logs that a start which created the slot then failed (cause,
// at ERROR) or was stopped (stopped, at WARN) before streaming it: the
// slot is not dropped (it may hold rows committed while the start waited
// for Kafka, in no other stream), so the line names it, the WAL it holds,
// and the way to drop it if walrelay will not run with it again.
func leftSlot(cfg *Config, log *slog.Logger, stopped bool, cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held := "an unknown amount of WAL"
	if conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy()); err == nil {
		if st, err := replication.Slots(ctx, conn, cfg.Slot); err == nil && st[0].RetainedWALBytes != nil {
			held = fmt.Sprintf("%.1f MiB of WAL", float64(*st[0].RetainedWALBytes)/(1<<20))
		}
		conn.Close(context.Background())
	}
	what, level := "failed", slog.LevelError
	if stopped {
		what, level = "was stopped", slog.LevelWarn
	}
	attrs := []any{"slot", cfg.Slot, "held", held}
	if cause != nil {
		attrs = append(attrs, "err", cause)
	}
	log.Log(context.Background(), level, "this start created replication slot "+cfg.Slot+" and then "+what+" before streaming it: the slot stays, holding "+held+" until a walrelay streams it "+
		"(it may hold rows committed since it was created, in no other stream, so it is not dropped). Fix the cause and start again: nothing is lost. "+
		"If walrelay will not run with this slot, drop it, after reconciling the rows committed since (walrelay reconcile --since <the start's time> --replay --yes): walrelay slot drop "+cfg.Slot+" --yes",
		attrs...)
}

// createPublicationAndSlot creates the publication of spec and the slot if
// they are missing (postgres.create_slot), the publication first; createdSlot
// says whether it created the slot.
func createPublicationAndSlot(cctx context.Context, conn *pgx.Conn, cfg *Config, spec replication.Outbox, log *slog.Logger) (createdSlot bool, err error) {
	// The publication first: a slot only sees a publication created
	// before the changes it decodes.
	created, added, err := replication.EnsurePublication(cctx, conn, spec)
	for _, t := range added {
		log.Warn("added an outbox table to the publication: rows written to it before now are not in the stream (walrelay replay --table can send them)",
			"publication", cfg.Publication, "table", t)
	}
	if err != nil {
		return false, err
	}
	if created {
		log.Info("created publication", "publication", cfg.Publication, "tables", spec.Names())
	}
	createdSlot, err = replication.EnsureSlot(cctx, conn, cfg.Slot, cfg.Publication, false)
	if err != nil {
		return false, err
	}
	if createdSlot {
		log.Info("created replication slot", "slot", cfg.Slot)
	}
	if ok, err := replication.SlotRecorded(cctx, conn, cfg.Publication, cfg.Slot); err == nil && !ok {
		log.Warn("the slot could not be recorded on the publication (that needs the publication's owner): if the slot is dropped, walrelay cannot tell and would create it again, after the gap",
			"slot", cfg.Slot, "publication", cfg.Publication)
	}
	return createdSlot, nil
}

// checkSlotSettings refuses, before anything is created,
// postgres.slot_failover on a server without failover slots, so that
// prepareSlot does not fail after creating the slot (replication.New
// checked the slot's name).
func checkSlotSettings(ctx context.Context, conn *pgx.Conn, cfg *Config) error {
	if !cfg.SlotFailover {
		return nil
	}
	v, err := replication.ServerVersion(ctx, conn)
	if err != nil {
		return err
	}
	if v < 17 {
		return fmt.Errorf("postgres.slot_failover needs PostgreSQL 17 or later (failover slots); this server is PostgreSQL %d", v)
	}
	return nil
}

// markFailover marks the slot for failover when postgres.slot_failover asks
// for it. A slot in use (another instance holds it) is left as it is: that
// instance marks it.
func markFailover(ctx context.Context, conn *pgx.Conn, cfg *Config, log *slog.Logger) error {
	if !cfg.SlotFailover {
		return nil
	}
	marked, err := replication.MarkFailover(ctx, conn, &cfg.ConnConfig.Config, cfg.Slot)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55006" {
		log.Warn("the slot is in use: not marked for failover now", "slot", cfg.Slot, "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("postgres.slot_failover: %w", err)
	}
	if marked {
		log.Info("marked the replication slot for failover: a standby with sync_replication_slots keeps a copy", "slot", cfg.Slot)
	}
	return nil
}

// VersionTypes are the types (as format_type writes them) a version column
// (outbox.version_column) may have.
var VersionTypes = []string{"smallint", "integer", "bigint"}

// CheckVersionType refuses a version column (outbox.version_column) of o
// whose type in types (format_type, by column, as TableColumns reads them)
// is not one of VersionTypes.
func CheckVersionType(o decoder.Layout, types map[string]string) error {
	if typ, ok := types[o.VersionColumn]; ok && o.VersionColumn != "" && !slices.Contains(VersionTypes, typ) {
		return fmt.Errorf("column %q of %s.%s is %s; as the version column (outbox.version_column) it must be one of %s", o.VersionColumn, o.Schema, o.Table, typ, strings.Join(VersionTypes, ", "))
	}
	return nil
}

// CheckTable checks that the outbox table of o exists with every column
// walrelay reads, the version column of an integer type, none of them
// generated.
func CheckTable(ctx context.Context, conn *pgx.Conn, o decoder.Layout) error {
	o = o.WithDefaults()
	schema, table := o.Schema, o.Table
	names, cols, err := TableColumns(ctx, conn, schema, table)
	if err != nil {
		return fmt.Errorf("read columns of %s.%s: %w", schema, table, err)
	}
	if len(names) == 0 {
		return fmt.Errorf("outbox table %s.%s does not exist (create it with walrelay migrate)", schema, table)
	}
	for _, need := range Columns(o) {
		if _, ok := cols[need.Name]; !ok {
			if need.Role == "header" {
				return fmt.Errorf("table %s.%s has no column %q (outbox.header_columns)", schema, table, need.Name)
			}
			return fmt.Errorf("table %s.%s has no column %q (%s); its columns are %s", schema, table, need.Name, need.Key, strings.Join(names, ", "))
		}
	}
	if err := CheckVersionType(o, cols); err != nil {
		return err
	}
	generated, err := GeneratedColumns(ctx, conn, o)
	if err != nil {
		return err
	}
	if len(generated) > 0 {
		return fmt.Errorf("column %s of %s.%s is GENERATED: logical replication does not send generated columns; store the value in a plain column", strings.Join(generated, ", "), schema, table)
	}
	return nil
}

// GeneratedColumns lists the columns walrelay reads that are GENERATED:
// pgoutput leaves them out of what it sends (before PostgreSQL 18, and there
// unless asked), so their rows would stop the stream.
func GeneratedColumns(ctx context.Context, conn *pgx.Conn, o decoder.Layout) ([]string, error) {
	o = o.WithDefaults()
	var generated []string
	err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(attname::text ORDER BY attnum), '{}') FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attgenerated <> '' AND attname = ANY ($2)`, pgx.Identifier{o.Schema, o.Table}.Sanitize(), columnNames(o)).Scan(&generated)
	if err != nil {
		return nil, fmt.Errorf("read the generated columns of %s.%s: %w", o.Schema, o.Table, err)
	}
	return generated, nil
}

// TableColumns returns the columns of schema.table in order and their types
// (format_type); none when the table does not exist.
func TableColumns(ctx context.Context, conn *pgx.Conn, schema, table string) ([]string, map[string]string, error) {
	rows, err := conn.Query(ctx, `SELECT a.attname, format_type(a.atttypid, NULL) FROM pg_attribute a
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, pgx.Identifier{schema, table}.Sanitize())
	if err != nil {
		return nil, nil, err
	}
	var names []string
	types := map[string]string{}
	var n, t string
	_, err = pgx.ForEachRow(rows, []any{&n, &t}, func() error {
		names = append(names, n)
		types[n] = t
		return nil
	})
	return names, types, err
}
