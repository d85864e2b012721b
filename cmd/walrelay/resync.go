package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pglogrepl"

	"github.com/walrelay/walrelay/cmd/walrelay/internal/admin"
	"github.com/walrelay/walrelay/replication"
)

// cmdSlotResync is `walrelay slot resync [--yes]`: the way out of a slot
// whose position is before its publication's creation (a switch-over from
// Debezium on Debezium's slot, a publication dropped and created again
// under a kept slot), with nothing lost that the outbox table holds. It
// creates the publication if it is missing, moves the slot to the current
// end of the WAL (past the publication's creation), then reconciles the
// whole table against the topics and replays every row missing from them
// (reconcile --all --replay --yes). The whole table is the window: the WAL
// keeps no commit time of the slot's old position, so no shorter window
// surely covers the gap. Rows committed after the slot's new position are
// streamed by walrelay run; the reconcile may send some of them too
// (duplicates with the same id, never a loss). Without --yes it says what
// it would do.
func cmdSlotResync(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	a := newAdminCmd("slot resync", stderr, stdout)
	yes := a.fs.Bool("yes", false, "really do it (without it, only say what would be done)")
	a.fs.String("table", "", "the outbox table, schema.table: required when outbox.tables lists several (passed to reconcile)")
	if _, err := a.parse(args, 0, true); err != nil {
		return err
	}
	if *a.json {
		return usageError{"slot resync: --json is not supported (it runs reconcile, whose --json is walrelay reconcile --all --replay --json)"}
	}
	conn, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	slot, pub := a.cfg.Postgres.Slot, a.cfg.Postgres.Publication
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
			fmt.Fprintf(a.out, "slot %s can be streamed with publication %s: nothing to resync\n", slot, pub)
			return nil
		}
	}
	target, err := pglogrepl.ParseLSN(s.CurrentWALLSN)
	if err != nil {
		return err
	}
	confirmed := orDash(s.ConfirmedFlushLSN, func(x string) string { return x })
	if !*yes {
		if missing {
			fmt.Fprintf(a.out, "would create publication %s\n", pub)
		}
		fmt.Fprintf(a.out, "would move slot %s from %s to the current end of the WAL (now %s), past publication %s's creation, "+
			"then reconcile the whole outbox table against the topics and replay every row missing from them (walrelay reconcile --all --replay --yes); add --yes to do it\n",
			slot, confirmed, target, pub)
		return nil
	}
	if missing {
		created, _, err := replication.EnsurePublication(ctx, conn, a.cfg.PublicationSpec(pub))
		if err != nil {
			return err
		}
		fmt.Fprintf(a.out, "publication %s for %s %s\n", pub, a.cfg.PublicationSpec(pub).Names(), createdWord(created))
		// The slot moves past the creation: a WAL position after it.
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(lsnText{&target}); err != nil {
			return fmt.Errorf("read the WAL position: %w", err)
		}
	}
	was, now, err := replication.AdvanceSlot(ctx, conn, slot, target, false)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.out, "moved slot %s from %s to %s (%s of WAL): walrelay run streams what commits after it\n", slot, was, now, admin.HumanBytes(int64(now-was)))
	if behind, err := replication.PublicationGap(ctx, conn, slot, pub); err != nil || behind {
		return fmt.Errorf("slot %s is still before publication %s after the move (%v): report this", slot, pub, err)
	}
	fmt.Fprintf(a.out, "reconciling the whole outbox table against the topics: the rows of the skipped WAL that are missing from their topic are replayed\n")
	err = cmdReconcile(ctx, append(args, "--all", "--replay", "--wait", "1s"), stdout, stderr)
	var code exitCode
	if errors.As(err, &code) && code == 2 {
		err = nil // the missing rows were replayed
	}
	if err != nil {
		return fmt.Errorf("the slot was moved, the reconcile failed (run walrelay reconcile --all --replay --yes again): %w", err)
	}
	fmt.Fprintf(a.out, "slot %s resynced with publication %s: start walrelay run\n", slot, pub)
	return nil
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
