package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/cmd/walrelay/internal/admin"
	"github.com/walrelay/walrelay/internal/shellquote"
	"github.com/walrelay/walrelay/recovery"
	"github.com/walrelay/walrelay/replication"
)

// resyncOldTxWait bounds how long slot resync waits, before it moves the
// slot, for the transactions of this database that may have begun writing
// before the publication existed.
const resyncOldTxWait = 30 * time.Second

// cmdSlotResync is `walrelay slot resync [--yes]`: the way out of a slot
// whose position is before its publication's creation (a switch-over from
// Debezium on Debezium's slot, a publication dropped and created again
// under a kept slot), with nothing lost that the outbox tables hold. It
// moves the slot to the current end of the WAL (past the publication's
// creation), then reconciles every outbox table of the configuration
// against the topics and replays every row missing from them (reconcile
// --all --replay --yes, per table). The whole table is the window: the WAL
// keeps no commit time of the slot's old position, so no shorter window
// surely covers the gap. Rows committed after the slot's new position are
// streamed by walrelay run; the reconcile may send some of them too
// (duplicates with the same id, never a loss).
//
// The move cannot be undone (the skipped WAL is then only in the tables),
// so everything that can refuse is done before it: the tables are opened,
// Kafka is pinged, the topics are checked as reconcile --replay would
// (refused when compacted or trimmed), the publication is created if it is
// missing, and the transactions of this database that may have begun
// writing before it existed are waited for (resyncTarget). A failure after the move says which reconciles
// remain to run, and exits non-zero. Without --yes it runs the checks and
// says what it would do.
func cmdSlotResync(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newRecoveryCmd("slot resync", stdout, stderr, false)
	if _, err := c.parse(args, 0, true); err != nil {
		return err
	}
	if *c.json {
		return usageError{"slot resync: --json is not supported (it runs reconcile, whose --json is walrelay reconcile --all --replay --json)"}
	}
	layouts := c.cfg.OutboxConfig().Layouts()
	var names []string
	for _, l := range layouts {
		names = append(names, l.Name())
	}
	if *c.table != "" {
		if len(layouts) > 1 {
			return usageError{fmt.Sprintf("slot resync: the slot moves past the WAL of every outbox table, so it reconciles all of them (%s): --table would leave the others' rows of the gap in no stream; leave it out", strings.Join(names, ", "))}
		}
		if _, err := c.cfg.Layout(*c.table); err != nil {
			return err
		}
	}
	limitMemory(c.cfg)
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	slot, pub := c.cfg.Postgres.Slot, c.cfg.Postgres.Publication
	slots, err := replication.Slots(ctx, conn, slot)
	if err != nil {
		return err
	}
	s := slots[0]
	if s.Active {
		return fmt.Errorf("slot %s is in use by server process %s: stop its reader first (or, if it is Debezium, let it run until walrelay check says OK: then no resync is needed)", slot, orDash(s.ActivePID, func(p int) string { return fmt.Sprint(p) }))
	}
	_, pubErr := replication.Publication(ctx, conn, pub)
	missing := errors.Is(pubErr, replication.ErrPublicationMissing)
	if pubErr != nil && !missing {
		return pubErr
	}
	if !missing {
		behind, err := replication.PublicationGap(ctx, conn, slot, pub)
		if err != nil {
			return err
		}
		if !behind {
			fmt.Fprintf(c.out, "slot %s can be streamed with publication %s: nothing to resync\n", slot, pub)
			return nil
		}
	}

	// Everything that can refuse, before the move.
	var tables []*recovery.Table
	for _, l := range layouts {
		t, err := recovery.Open(ctx, conn, l)
		if err != nil {
			return fmt.Errorf("slot resync: nothing was moved: %w", err)
		}
		t.LimitPayload(c.cfg.MaxMessageBytes())
		tables = append(tables, t)
	}
	sk, opts, err := c.sink(ctx)
	if err != nil {
		return fmt.Errorf("slot resync: nothing was moved (the reconcile after the move needs Kafka): %w", err)
	}
	defer sk.Close()
	for _, t := range tables {
		rc := &recovery.Reconciler{Table: t, Publisher: sk, Kafka: opts, DLQTopic: c.cfg.Kafka.DLQTopic}
		notes, err := rc.Trimmed(ctx, recovery.Window{All: true})
		if err != nil {
			return fmt.Errorf("slot resync: nothing was moved: check the topics of %s: %w", t.Name(), err)
		}
		if len(notes) > 0 {
			return fmt.Errorf("slot resync: nothing was moved: the reconcile after the move could not replay the rows of %s that count as missing (reconcile --replay refuses such topics), because %s. "+
				"Instead: run the slot's former reader until walrelay check says OK for the slot; or move the slot yourself (walrelay lsn advance %s --to-current --yes), "+
				"list the missing rows of each table (walrelay reconcile --all --table TABLE), and send those you know are missing (walrelay replay --ids FILE --table TABLE --yes); "+
				"do not prune the outbox tables before that", t.Name(), strings.Join(notes, "; "), slot)
		}
	}
	confirmed := orDash(s.ConfirmedFlushLSN, func(x string) string { return x })
	if !*c.yes {
		if missing {
			fmt.Fprintf(c.out, "would create publication %s\n", pub)
		}
		fmt.Fprintf(c.out, "checked: the outbox tables %s, Kafka answers, no topic is compacted or trimmed\n", strings.Join(names, ", "))
		fmt.Fprintf(c.out, "would move slot %s from %s to the current end of the WAL, past publication %s's creation, "+
			"then reconcile each outbox table (%s) against the topics and replay every row missing from them (walrelay reconcile --all --replay --yes --table TABLE); add --yes to do it\n",
			slot, confirmed, pub, strings.Join(names, ", "))
		fmt.Fprintln(c.out, resyncBlindSpot)
		return nil
	}
	if missing {
		created, _, err := replication.EnsurePublication(ctx, conn, c.cfg.PublicationSpec(pub))
		if err != nil {
			return fmt.Errorf("slot resync: nothing was moved: %w", err)
		}
		fmt.Fprintf(c.out, "publication %s for %s %s\n", pub, c.cfg.PublicationSpec(pub).Names(), createdWord(created))
	}
	target, err := resyncTarget(ctx, conn, resyncOldTxWait)
	if err != nil {
		return fmt.Errorf("slot resync: nothing was moved: %w", err)
	}

	// The move: from here on, a failure leaves the gap's rows only in the
	// tables, and says which reconciles remain.
	was, now, err := replication.AdvanceSlot(ctx, conn, slot, target, false)
	if err != nil {
		return fmt.Errorf("slot resync: %w", err) // refused or failed: not moved
	}
	fmt.Fprintf(c.out, "moved slot %s from %s to %s (%s of WAL): walrelay run streams what commits after it\n", slot, was, now, admin.HumanBytes(int64(now-was)))
	if now < target {
		return c.resyncUnfinished(slot, names, fmt.Errorf("slot %s moved only to %s, not to %s (the WAL flushed so far): run walrelay slot resync --yes again", slot, now, target))
	}
	// The slot is now past the publication's creation and past every
	// transaction of this database that could have written before it
	// (resyncTarget's marker wait). That is reasoning about the server's
	// internals, which has been wrong before (the snapshot's xmax missed a
	// transaction): the test of the moved slot with a temporary copy is what
	// is sure, and is mandatory when it can run. It needs a free slot of
	// max_replication_slots: with none, it is said, and resync goes on on
	// the strength of the wait alone (which passed, or nothing was moved).
	behind, err := replication.PublicationGap(ctx, conn, slot, pub)
	var pgErr *pgconn.PgError
	switch {
	case err != nil && errors.As(err, &pgErr) && pgErr.Code == "53400":
		fmt.Fprintf(c.out, "note: the test of the moved slot with a temporary copy could not run (no free slot of max_replication_slots: %v); "+
			"going on because every transaction of this database older than the publication had ended before the move; run walrelay check before walrelay run\n", err)
	case err != nil:
		return c.resyncUnfinished(slot, names, fmt.Errorf("the test of the moved slot with a temporary copy failed (run walrelay check: it repeats the test): %w", err))
	case behind:
		return c.resyncUnfinished(slot, names, fmt.Errorf("slot %s is still before publication %s after the move: report this", slot, pub))
	}
	base := withoutFlag(args, "table")
	var failed []string
	var errs []error
	for _, name := range names {
		fmt.Fprintf(c.out, "reconciling %s against the topics: the rows of the skipped WAL that are missing from their topic are replayed\n", name)
		err := cmdReconcile(ctx, append(append([]string{}, base...), "--table", name, "--all", "--replay", "--yes", "--wait", "1s"), stdout, stderr)
		var code exitCode
		if errors.As(err, &code) && code == 2 {
			err = nil // the missing rows were replayed
		}
		if err != nil {
			failed = append(failed, name)
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	if len(failed) > 0 {
		return c.resyncUnfinished(slot, failed, errors.Join(errs...))
	}
	fmt.Fprintf(c.out, "slot %s resynced with publication %s: every outbox table reconciled (%s): start walrelay run\n", slot, pub, strings.Join(names, ", "))
	fmt.Fprintln(c.out, resyncBlindSpot)
	return nil
}

// resyncBlindSpot is what slot resync cannot see, said with its plan and
// its result: a reconcile compares the rows the tables hold with the
// topics, and a row deleted after its insert in the skipped WAL is in
// neither.
const resyncBlindSpot = "not seen: a row deleted from an outbox table after its insert, within the skipped WAL, is in no table, so the reconcile cannot replay it " +
	"and walrelay cannot tell whether there were any: if your application deletes outbox rows after inserting them (or prune ran over the gap), " +
	"those rows of the gap are lost this way; run the slot's former reader instead, until walrelay check says OK for the slot, if it can still run"

// resyncUnfinished is a failure after the slot was moved: it prints the
// reconciles that remain, one per table, and the warning not to prune
// before they pass, and returns err with that said.
func (c *recoveryCmd) resyncUnfinished(slot string, tables []string, err error) error {
	fmt.Fprintf(c.out, "\nWARNING: slot %s was moved: the rows committed in the skipped WAL are now only in the outbox tables, and not all of them were reconciled.\n"+
		"Run, with this command's configuration (--config, flags, environment), until each exits 0:\n", slot)
	for _, t := range tables {
		fmt.Fprintf(c.out, "  walrelay reconcile --all --replay --yes --table %s\n", shellquote.Arg(t))
	}
	fmt.Fprintf(c.out, "Do not run walrelay prune (nor delete outbox rows) before they pass: the slot's position no longer protects those rows.\n")
	return fmt.Errorf("slot %s was moved, and the reconcile of %s remains to run (see above; do not prune before it passes): %w", slot, strings.Join(tables, ", "), err)
}

// resyncTarget is where slot resync moves the slot: a WAL position after
// the publication's creation and after every transaction of this database
// that could have written before it (such a transaction, decoded at its
// commit, is decoded for those changes without the publication), flushed
// (a slot cannot move past the flushed WAL).
//
// Called once the publication exists, it takes a marker xid X in a
// transaction of its own, committed: every xid given out after X is newer
// than the publication's commit, so a transaction that first wrote before
// it has an xid below X. It waits until no transaction of this database
// (pg_stat_activity, pg_prepared_xacts) with an xid below X is running:
// not the snapshot's xmax, which is only the last completed xid + 1 (a
// transaction that took its xid after the publication's, before its
// commit, is above it). Another database's transactions are never decoded
// by the slot and are not waited for. Then it reads the insert position
// and commits a second marker with synchronous_commit on: that commit
// flushes the WAL past the position, on a quiet server too (an open
// transaction's WAL at the end is flushed by nothing else). It waits up to
// wait for the older transactions, and refuses if they do not end.
func resyncTarget(ctx context.Context, conn *pgx.Conn, wait time.Duration) (pglogrepl.LSN, error) {
	x, err := markerXid(ctx, conn)
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(wait)
	for {
		var pids, prepared string
		err := conn.QueryRow(ctx, `SELECT
			coalesce((SELECT string_agg(pid::text, ', ' ORDER BY pid) FROM pg_stat_activity
				WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND backend_xid IS NOT NULL AND pid <> pg_backend_pid() AND age(backend_xid) > age($1::xid8::xid)), ''),
			coalesce((SELECT string_agg(gid, ', ' ORDER BY gid) FROM pg_prepared_xacts
				WHERE database = current_database() AND age(transaction) > age($1::xid8::xid)), '')`, x).Scan(&pids, &prepared)
		if err != nil {
			return 0, fmt.Errorf("read the running transactions: %w", err)
		}
		if pids == "" && prepared == "" {
			break
		}
		if time.Now().After(deadline) {
			var held []string
			if pids != "" {
				held = append(held, "server processes "+pids)
			}
			if prepared != "" {
				held = append(held, "prepared transactions (pg_prepared_xacts) "+prepared)
			}
			return 0, fmt.Errorf("transactions of this database that began writing before the publication existed are still running after %s (%s): the slot cannot move past them yet; end them, or run walrelay slot resync --yes again later", wait, strings.Join(held, "; "))
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	var target pglogrepl.LSN
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(lsnText{&target}); err != nil {
		return 0, fmt.Errorf("read the WAL position: %w", err)
	}
	if _, err := markerXid(ctx, conn); err != nil { // its commit flushes the WAL past target
		return 0, err
	}
	for {
		var flushed pglogrepl.LSN
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn()::text").Scan(lsnText{&flushed}); err != nil {
			return 0, fmt.Errorf("read the WAL position: %w", err)
		}
		if flushed >= target {
			return target, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the WAL is not flushed to %s after %s (flushed: %s)", target, wait, flushed)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// markerXid takes a transaction id in a transaction of its own and commits
// it with synchronous_commit on (the commit flushes the WAL up to it). It
// returns the xid's text (xid8).
func markerXid(ctx context.Context, conn *pgx.Conn) (string, error) {
	var x string
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit TO on"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text").Scan(&x)
	})
	if err != nil {
		return "", fmt.Errorf("take a marker transaction id: %w", err)
	}
	return x, nil
}

// withoutFlag returns args without the flag name and its value (-name V,
// --name V, -name=V, --name=V).
func withoutFlag(args []string, name string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "-"+name || a == "--"+name {
			i++ // and its value
			continue
		}
		if strings.HasPrefix(a, "-"+name+"=") || strings.HasPrefix(a, "--"+name+"=") {
			continue
		}
		out = append(out, a)
	}
	return out
}

// lsnText scans an LSN's text.
type lsnText struct{ p *pglogrepl.LSN }

func (l lsnText) Scan(src any) error {
	s, ok := src.(string)
	if !ok {
		return fmt.Errorf("an LSN of type %T", src)
	}
	v, err := pglogrepl.ParseLSN(s)
	*l.p = v
	return err
}
