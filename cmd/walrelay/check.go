package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/cmd/walrelay/internal/admin"
	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/poll"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/replication"
	"github.com/walrelay/walrelay/sink"
	"github.com/walrelay/walrelay/sink/record"
)

// checkResult is one line of `walrelay check`.
type checkResult struct {
	Check  string `json:"check"`
	Status string `json:"status"` // ok, warn, fail
	Detail string `json:"detail"`
}

// cmdCheck is the preflight against the configured database and brokers:
// every line says what it checked and, when it is not ok, what to fix.
func cmdCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	a := newAdminCmd("check", stderr, stdout)
	if _, err := a.parse(args, 0, false); err != nil {
		return err
	}
	results := runChecks(ctx, a.cfg)
	fails := 0
	for _, r := range results {
		if r.Status == "fail" {
			fails++
		}
	}
	if *a.json {
		if err := a.printJSON(results); err != nil {
			return err
		}
	} else {
		for _, r := range results {
			fmt.Fprintf(stdout, "%-4s  %-26s %s\n", strings.ToUpper(r.Status), r.Check, r.Detail)
		}
	}
	if fails > 0 {
		return fmt.Errorf("check: %d of %d checks failed", fails, len(results))
	}
	return nil
}

// usableTypes are the column types walrelay reads for each required column.
var usableTypes = map[string][]string{
	"id":            {"uuid", "text", "character varying", "character", "bigint", "integer"},
	"aggregatetype": {"text", "character varying", "character", "name"},
	"aggregateid":   {"text", "character varying", "character", "uuid", "bigint", "integer", "smallint", "numeric", "name"},
	"type":          {"text", "character varying", "character", "name"},
	"payload":       {"jsonb", "json", "text", "character varying", "bytea"},
}

func runChecks(ctx context.Context, cfg *config.Config) []checkResult {
	var out []checkResult
	add := func(check, status, format string, args ...any) {
		out = append(out, checkResult{Check: check, Status: status, Detail: fmt.Sprintf(format, args...)})
	}
	// The settings whose trust is judged without connecting: TLS to both
	// sides, and the topics a row can choose.
	for _, tc := range cfg.TrustChecks() {
		status := "ok"
		if !tc.OK {
			status = "warn"
		}
		add(tc.Name, status, "%s", tc.Detail)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, cfg.Postgres.DSN)
	if err != nil {
		add("postgres", "fail", "%v", config.ScrubError(fmt.Errorf("connect: %w", err), cfg.Secrets()))
		return append(out, checkKafka(cctx, cfg, cfg.Kafka.TransactionalID)...)
	}
	defer conn.Close(context.Background())
	add("postgres", "ok", "connected to %s", config.RedactDSN(cfg.Postgres.DSN))
	if cfg.Source == "poll" {
		checkPoll(cctx, conn, cfg, add)
		kafka := checkKafka(cctx, cfg, "")
		return append(out, kafka...)
	}

	setting := func(name string) string {
		var v string
		if err := conn.QueryRow(cctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			return "?"
		}
		return v
	}
	if lvl := setting("wal_level"); lvl == "logical" {
		add("wal_level", "ok", "logical")
	} else {
		add("wal_level", "fail", "%s: set wal_level = logical in postgresql.conf and restart the server", lvl)
	}

	var slots, senders, maxSlots, maxSenders int
	var ourSlot bool
	_ = conn.QueryRow(cctx, `SELECT (SELECT count(*) FROM pg_replication_slots), (SELECT count(*) FROM pg_stat_replication),
		current_setting('max_replication_slots')::int, current_setting('max_wal_senders')::int,
		EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, cfg.Postgres.Slot).Scan(&slots, &senders, &maxSlots, &maxSenders, &ourSlot)
	switch {
	case ourSlot || slots < maxSlots:
		add("max_replication_slots", "ok", "%d of %d in use", slots, maxSlots)
	default:
		add("max_replication_slots", "fail", "all %d in use and slot %s is not one of them: raise max_replication_slots or drop an unused slot", maxSlots, cfg.Postgres.Slot)
	}
	if senders < maxSenders {
		add("max_wal_senders", "ok", "%d of %d in use", senders, maxSenders)
	} else {
		add("max_wal_senders", "fail", "all %d in use: raise max_wal_senders", maxSenders)
	}

	if role, ok, err := relay.ReplicationRole(cctx, conn); err != nil {
		add("replication role", "fail", "%v", err)
	} else if ok {
		add("replication role", "ok", "role %s may replicate", role)
	} else {
		add("replication role", "fail", "role %s lacks the REPLICATION attribute: ALTER ROLE %s REPLICATION", role, pgx.Identifier{role}.Sanitize())
	}

	pub, pubErr := replication.Publication(cctx, conn, cfg.Postgres.Publication)
	layouts := cfg.OutboxConfig().Layouts()
	for _, l := range layouts {
		checkTable(cctx, conn, l, len(layouts) > 1, true, pubErr, add)
	}

	switch {
	case errors.Is(pubErr, replication.ErrPublicationMissing):
		// Behind an existing slot, a publication is created while the
		// slot's reader runs, or by walrelay slot resync.
		note, err := replication.NewPublicationBehindSlot(cctx, conn, cfg.Postgres.Publication, cfg.Postgres.Slot, true)
		switch {
		case err != nil:
			add("publication", "fail", "%v", err)
		case note != "":
			add("publication", "fail", "publication %s does not exist: run walrelay publication create now, while slot %s's reader runs (%s)", cfg.Postgres.Publication, cfg.Postgres.Slot, note)
		default:
			add("publication", "fail", "publication %s does not exist: run walrelay migrate or walrelay publication create", cfg.Postgres.Publication)
		}
	case pubErr != nil:
		add("publication", "fail", "%v", pubErr)
	default:
		spec := cfg.PublicationSpec(cfg.Postgres.Publication)
		problems, err := replication.CheckPublication(cctx, conn, spec)
		switch {
		case err != nil:
			add("publication", "fail", "%v", err)
		case len(problems) > 0:
			for _, p := range problems {
				add("publication", "fail", "%s: %s", pub.Name, p)
			}
		default:
			add("publication", "ok", "%s publishes %s alone (%s)", pub.Name, spec.Names(), strings.Join(pub.Publish, ", "))
		}
	}
	ocfg := cfg.OutboxConfig()
	if err := relay.CheckEmitFunction(cctx, conn, ocfg); err != nil {
		add("walrelay_emit", "fail", "%v", err)
	}
	var from uint64
	err = relay.CheckMessagePrivileges(cctx, conn, ocfg)
	if err == nil {
		from, _, err = relay.CheckMessageHorizon(cctx, conn, ocfg)
	}
	for _, l := range layouts {
		if err := relay.CheckChildPrivileges(cctx, conn, l); err != nil {
			add("partitions", "fail", "%v", err)
		}
	}
	if err == nil {
		var warnings []string
		warnings, err = relay.CheckMessageTableRules(cctx, conn, ocfg)
		for _, w := range warnings {
			add("messages", "warn", "%s", w)
		}
	}
	switch {
	case err != nil:
		add("messages", "fail", "%v", err)
	case ocfg.Messages:
		add("messages", "ok", "on: only roles that may insert into %s may execute pg_logical_emit_message, since transaction %d (messages of older transactions are dead-lettered)", layouts[0].Name(), from)
	default:
		add("messages", "ok", "off (outbox.messages): logical decoding messages are not events, whoever emits them")
	}
	var mayEmit bool
	if cfg.Heartbeat.Interval > 0 && conn.QueryRow(cctx, `SELECT coalesce(bool_or(has_function_privilege(oid, 'EXECUTE')), false) FROM pg_proc
		WHERE proname = 'pg_logical_emit_message' AND pronamespace = 'pg_catalog'::regnamespace AND proargtypes[2] = 'text'::regtype`).Scan(&mayEmit) == nil && !mayEmit {
		add("heartbeat", "warn", "heartbeat.interval is set, but the role may not execute pg_logical_emit_message (revoked from PUBLIC for outbox.messages): "+
			"every heartbeat will fail; GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) TO <walrelay's role>, which outbox.messages accepts only with INSERT on the outbox too, or leave heartbeat.interval unset (keepalives move the slot)")
	}

	if st, err := replication.Slots(cctx, conn, cfg.Postgres.Slot); err != nil {
		if recorded, _ := replication.SlotRecorded(cctx, conn, cfg.Postgres.Publication, cfg.Postgres.Slot); recorded {
			add("slot", "fail", "slot %s was created by walrelay and is gone: rows committed since its last position are no longer in the WAL stream; walrelay slot create %s, then walrelay reconcile %s --replay --yes", cfg.Postgres.Slot, cfg.Postgres.Slot, reconcileWindow(cctx, cfg, conn.Config(), "a time before the loss"))
		} else if cfg.Postgres.CreateSlot {
			add("slot", "warn", "slot %s does not exist; walrelay run will create it (events committed before that are not captured: run walrelay migrate before the application writes)", cfg.Postgres.Slot)
		} else {
			add("slot", "fail", "slot %s does not exist and postgres.create_slot is false: run walrelay migrate", cfg.Postgres.Slot)
		}
	} else if s := st[0]; s.Database != conn.Config().Database {
		add("slot", "fail", "%v", replication.SlotOfAnotherDatabase(s.SlotName, s.Database, conn.Config().Database))
	} else if s.Plugin != "pgoutput" {
		add("slot", "fail", "slot %s uses plugin %s; walrelay needs pgoutput", s.SlotName, s.Plugin)
	} else if s.WALStatus != nil && *s.WALStatus == "lost" {
		add("slot", "fail", "slot %s was invalidated (wal_status lost): drop and recreate it, then walrelay reconcile %s --replay --yes", s.SlotName, reconcileWindow(cctx, cfg, conn.Config(), "a time before the loss"))
	} else {
		lag := int64(0)
		if s.LagBytes != nil {
			lag = *s.LagBytes
		}
		// Its own time: the decode of a copy of the slot reads the WAL
		// since the slot's position.
		gctx, gcancel := context.WithTimeout(ctx, 20*time.Second)
		behind, err := replication.PublicationGap(gctx, conn, s.SlotName, cfg.Postgres.Publication)
		gcancel()
		switch {
		case behind && err == nil:
			add("slot", "fail", "%v", replication.PublicationGapError(s.SlotName, cfg.Postgres.Publication))
		case err != nil:
			add("slot", "warn", "%s (pgoutput), %s behind the server; could not tell whether its position is after publication %s was created: %v", s.SlotName, admin.HumanBytes(lag), cfg.Postgres.Publication, err)
		default:
			add("slot", "ok", "%s (pgoutput), %s behind the server", s.SlotName, admin.HumanBytes(lag))
		}
		// The publication itself behind the slot: that failure's way out
		// (slot resync) covers its tables; otherwise each table added after
		// the slot's position is its own warning.
		gapSaid := behind && err == nil
		if tables, err := replication.TablesAddedAfterSlot(cctx, conn, s.SlotName, cfg.Postgres.Publication); err != nil && !gapSaid {
			add("late tables", "warn", "could not tell whether an outbox table was added to publication %s after slot %s's position: %v", cfg.Postgres.Publication, s.SlotName, err)
		} else if len(tables) > 0 && !gapSaid {
			add("late tables", "warn", "%s", replication.TablesAddedAfterSlotError(s.SlotName, cfg.Postgres.Publication, tables))
		}
	}

	checkFailover(cctx, conn, cfg, add)

	if keep := setting("max_slot_wal_keep_size"); keep == "-1" {
		add("max_slot_wal_keep_size", "warn", "unlimited: a stopped walrelay lets its slot keep WAL until the disk fills; bound it, e.g. ALTER SYSTEM SET max_slot_wal_keep_size = '10GB' and SELECT pg_reload_conf()")
	} else {
		add("max_slot_wal_keep_size", "ok", "%s", keep)
	}
	checkInactiveSlots(cctx, conn, cfg.Postgres.Slot, add)
	txnID := cfg.Kafka.TransactionalID
	if cfg.Kafka.ExactlyOnce && txnID == "" {
		if sysID, err := replication.SystemID(cctx, &conn.Config().Config); err == nil {
			txnID = relay.TransactionalID(sysID, conn.Config().Database, cfg.Postgres.Slot)
		}
	}
	return append(out, checkKafka(cctx, cfg, txnID)...)
}

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

// checkKafka checks the brokers, and what exactly-once mode needs of them
// when it is on (txnID is its transactional id, if known), the schema
// registry of the registry formats (avro, registry_passthrough and the
// schema-first ones) and the schema-first subjects.
func checkKafka(ctx context.Context, cfg *config.Config, txnID string) []checkResult {
	out := checkKafkaBrokers(ctx, cfg, txnID)
	_, schemaFirst := record.Format(cfg.Kafka.ValueFormat).SchemaFirst()
	if cfg.Kafka.KeyFormat == string(record.FormatAvro) || cfg.Kafka.ValueFormat == string(record.FormatAvro) || cfg.Kafka.ValueFormat == string(record.FormatRegistryPassthrough) || schemaFirst {
		out = append(out, checkRegistry(ctx, cfg))
	}
	return append(out, checkSchemaFirst(ctx, cfg)...)
}

// checkRegistry checks that the schema registry of the registry formats
// answers, with the configured credentials.
func checkRegistry(ctx context.Context, cfg *config.Config) checkResult {
	r := checkResult{Check: "schema registry"}
	sr := cfg.Kafka.SchemaRegistry
	reg, err := config.Registry(cfg)
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err = reg.Ping(pctx)
	}
	if err != nil {
		r.Status, r.Detail = "fail", config.ScrubError(err, cfg.Secrets()).Error()
		return r
	}
	r.Status, r.Detail = "ok", sr.URL+" answers"
	return r
}

func checkKafkaBrokers(ctx context.Context, cfg *config.Config, txnID string) []checkResult {
	r := checkResult{Check: "kafka brokers"}
	if len(cfg.Kafka.Brokers) == 0 {
		r.Status, r.Detail = "fail", "kafka.brokers is not set"
		return []checkResult{r}
	}
	scfg, err := config.SinkConfig(cfg, nil) // no logger: check reports, the client's warnings would clutter it
	// A plain producer: a transactional one would fence the running relay.
	scfg.Transactions = nil
	var sk *sink.Sink
	if err == nil {
		sk, err = sink.New(scfg)
	}
	if err != nil {
		r.Status, r.Detail = "fail", err.Error()
		return []checkResult{r}
	}
	defer sk.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := sk.Ping(pctx); err != nil {
		r.Status, r.Detail = "fail", err.Error()
		return []checkResult{r}
	}
	r.Status, r.Detail = "ok", strings.Join(cfg.Kafka.Brokers, ",")+" answer"
	if !cfg.Kafka.ExactlyOnce {
		return []checkResult{r}
	}
	x := checkResult{Check: "kafka exactly-once"}
	// Longer than the ping: a broker's first transactional request makes
	// it create its transaction state topic, which takes seconds.
	tctx, tcancel := context.WithTimeout(ctx, time.Minute)
	defer tcancel()
	if detail, err := sk.CheckTransactions(tctx, cfg.Kafka.OffsetsTopic, txnID); err != nil {
		x.Status, x.Detail = "fail", err.Error()
	} else {
		x.Status, x.Detail = "ok", detail
	}
	return []checkResult{r, x}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// checkTable adds the checks of one outbox table: it exists, has each
// column walrelay reads in a usable type, and for source wal (wal) none
// generated, and the role may publish it. With several tables, each
// check's name ends with the table's.
func checkTable(cctx context.Context, conn *pgx.Conn, l decoder.Layout, several, wal bool, pubErr error, add func(name, status, format string, args ...any)) {
	schema, table, qualified := l.Schema, l.Table, l.Name()
	// With several tables, each check names its table.
	name := func(s string) string {
		if several {
			return s + " " + qualified
		}
		return s
	}
	colName := func(c string) string {
		if several {
			return "column " + qualified + "." + c
		}
		return "column " + c
	}
	_, cols, err := relay.TableColumns(cctx, conn, schema, table)
	if err != nil {
		add(name("outbox table"), "fail", "read the columns of %s: %v", qualified, err)
	}
	switch {
	case err != nil: // reported above
	case len(cols) == 0:
		add(name("outbox table"), "fail", "table %s does not exist: create it with walrelay migrate, or set postgres.table or outbox.tables", qualified)
	default:
		add(name("outbox table"), "ok", "%s exists", qualified)
		for _, c := range relay.Columns(l) {
			typ, ok := cols[c.Name]
			switch {
			case !ok && c.Role == "header":
				add(colName(c.Name), "fail", "table %s has no column %q (outbox.header_columns)", qualified, c.Name)
			case !ok:
				key := c.Key
				if several {
					key = strings.TrimPrefix(c.Key, "outbox.") + " of its outbox.tables entry, else " + c.Key
				}
				add(colName(c.Name), "fail", "table %s has no column %q (%s): add it, or point %s at another column", qualified, c.Name, key, key)
			case c.Role == "header":
			case !contains(usableTypes[c.Role], typ):
				add(colName(c.Name), "fail", "column %q is %s; as the %s column it must be one of %s", c.Name, typ, c.Role, strings.Join(usableTypes[c.Role], ", "))
			default:
				add(colName(c.Name), "ok", "%s", typ)
			}
		}
		if !wal {
			return
		}
		if generated, err := relay.GeneratedColumns(cctx, conn, l); err != nil {
			add(name("generated columns"), "fail", "%v", err)
		} else if len(generated) > 0 {
			add(name("generated columns"), "fail", "%s GENERATED: logical replication does not send generated columns; store the value in a plain column", strings.Join(generated, ", "))
		}
		if err := replication.CheckTableOwner(cctx, conn, schema, table); err != nil {
			status := "warn"
			if pubErr != nil {
				status = "fail" // the publication must still be created, which needs ownership
			}
			add(name("table ownership"), status, "%v", err)
		} else {
			add(name("table ownership"), "ok", "the role may create the publication")
		}
	}
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

// checkPoll adds the checks of source poll: each table's columns,
// and what the poll source needs of it (migrate --poll), and the role's
// privileges; logical replication is not needed.
func checkPoll(ctx context.Context, conn *pgx.Conn, cfg *config.Config, add func(name, status, format string, args ...any)) {
	add("source", "ok", "poll: the outbox table is polled; logical replication, the slot and the publication are not needed")
	layouts := cfg.OutboxConfig().Layouts()
	for _, l := range layouts {
		checkTable(ctx, conn, l, len(layouts) > 1, false, nil, add)
		name := "poll table"
		if len(layouts) > 1 {
			name += " " + l.Name()
		}
		if err := relay.CheckChildPrivileges(ctx, conn, l); err != nil {
			add("partitions", "fail", "%v", err)
		}
		if err := poll.CheckTable(ctx, conn, l); err != nil {
			add(name, "fail", "%v", err)
			continue
		}
		var sel, upd bool
		q := pgx.Identifier{l.Schema, l.Table}.Sanitize()
		if err := conn.QueryRow(ctx, "SELECT has_table_privilege($1, 'SELECT'), has_table_privilege($1, 'UPDATE')", q).Scan(&sel, &upd); err != nil {
			add(name, "fail", "read the role's privileges on %s: %v", l.Name(), err)
			continue
		}
		if !sel || !upd {
			add(name, "fail", "the role may not SELECT and UPDATE %s, which the poll source does: GRANT SELECT, UPDATE ON %s TO <walrelay's role>", l.Name(), q)
			continue
		}
		add(name, "ok", "%s has the poll columns, indexes and insert trigger; the role may select and update it", l.Name())
	}
	if err := relay.CheckEmitFunction(ctx, conn, cfg.OutboxConfig()); err != nil {
		add("walrelay_emit", "fail", "%v (source poll: walrelay migrate --poll)", err)
	}
}
