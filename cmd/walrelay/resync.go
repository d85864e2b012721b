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

	"github.com/walrelay/walrelay/cmd/walrelay/internal/admin"
	"github.com/walrelay/walrelay/recovery"
	"github.com/walrelay/walrelay/replication"
)

// resyncOldTxWait bounds how long slot resync waits, before it moves the
// slot, for the transactions that were running when the publication was
// seen to exist.
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
// missing, and the transactions that were running when it was seen to
// exist are waited for. A failure after the move says which reconciles
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
	// transaction that was running when it existed (resyncTarget): each
	// transaction it decodes committed later and began after it, so it is
	// decoded with the publication. The copy test below confirms it; it
	// needs a free slot of max_replication_slots, and is skipped when it
	// cannot run.
	if behind, err := replication.PublicationGap(ctx, conn, slot, pub); err != nil {
		fmt.Fprintf(c.out, "note: the test of the moved slot with a temporary copy could not run (%v): not needed, the slot is past the publication's creation and every transaction running at it\n", err)
	} else if behind {
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
	return nil
}

// resyncUnfinished is a failure after the slot was moved: it prints the
// reconciles that remain, one per table, and the warning not to prune
// before they pass, and returns err with that said.
func (c *recoveryCmd) resyncUnfinished(slot string, tables []string, err error) error {
	fmt.Fprintf(c.out, "\nWARNING: slot %s was moved: the rows committed in the skipped WAL are now only in the outbox tables, and not all of them were reconciled.\n"+
		"Run, with this command's configuration (--config, flags, environment), until each exits 0:\n", slot)
	for _, t := range tables {
		fmt.Fprintf(c.out, "  walrelay reconcile --all --replay --yes --table %s\n", t)
	}
	fmt.Fprintf(c.out, "Do not run walrelay prune (nor delete outbox rows) before they pass: the slot's position no longer protects those rows.\n")
	return fmt.Errorf("slot %s was moved, and the reconcile of %s remains to run (see above; do not prune before it passes): %w", slot, strings.Join(tables, ", "), err)
}

// resyncTarget is where slot resync moves the slot: a WAL position after
// the publication's creation and after every transaction that was running
// when the publication was seen to exist (such a transaction decoded later
// would be decoded, for its changes before the creation, without the
// publication), flushed (a slot cannot move past the flushed WAL). It
// waits up to wait for those transactions to end, and refuses if they do
// not.
func resyncTarget(ctx context.Context, conn *pgx.Conn, wait time.Duration) (pglogrepl.LSN, error) {
	var xmax string
	if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text").Scan(&xmax); err != nil {
		return 0, fmt.Errorf("read the running transactions: %w", err)
	}
	deadline := time.Now().Add(wait)
	for {
		var done bool
		if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmin(pg_current_snapshot()) >= $1::text::xid8", xmax).Scan(&done); err != nil {
			return 0, fmt.Errorf("read the running transactions: %w", err)
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			var pids string
			_ = conn.QueryRow(ctx, "SELECT coalesce(string_agg(pid::text, ', '), 'none: prepared transactions (pg_prepared_xacts)') FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()").Scan(&pids)
			return 0, fmt.Errorf("transactions that were running when the publication existed are still running after %s (server processes holding a transaction id: %s): the slot cannot move past them yet; end them, or run walrelay slot resync --yes again later", wait, pids)
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
