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
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/replication"
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
