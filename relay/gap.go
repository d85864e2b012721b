package relay

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/internal/shellquote"
	"github.com/walrelay/walrelay/replication"
)

// refusePublicationBehindSlot refuses to create the publication when the
// slot exists already: created now, it would be after the slot's position
// and the slot could not be streamed with it (a switch-over from Debezium
// on Debezium's slot, a publication dropped under a kept slot). The error
// gives the ways out.
func refusePublicationBehindSlot(ctx context.Context, conn *pgx.Conn, cfg *Config) error {
	_, err := replication.NewPublicationBehindSlot(ctx, conn, cfg.Publication, cfg.Slot, false)
	return err
}

// gapTimeout bounds the test of a slot against its publication's creation.
const gapTimeout = 20 * time.Second

// refusePublicationGap refuses to start on a slot whose position is before
// its publication's creation: PostgreSQL would fail the stream at the
// first transaction it cannot decode with it (up to 17), or skip its rows
// (18). When that cannot be told (no free slot for the copy that tells),
// it warns and lets the stream start: the stream's error names the cause.
//
// It takes at most gapTimeout of its own (the decode of the copy reads the
// WAL since the slot's position), not of the preflight's.
func refusePublicationGap(ctx context.Context, conn *pgx.Conn, cfg *Config, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, gapTimeout)
	defer cancel()
	behind, err := replication.PublicationGap(ctx, conn, cfg.Slot, cfg.Publication)
	switch {
	case err != nil && behind:
		log.Warn("could not tell whether the slot's position is after the publication's creation", "slot", cfg.Slot, "publication", cfg.Publication, "err", err)
		return nil
	case err != nil:
		return err
	case behind:
		return replication.PublicationGapError(cfg.Slot, cfg.Publication)
	}
	// A table added to the publication after the slot's position: its
	// rows written in between are not in the stream, and a refusal would
	// not bring them back (only the table has them): said, with the way
	// out, and the start goes on.
	tables, err := replication.TablesAddedAfterSlot(ctx, conn, cfg.Slot, cfg.Publication)
	if err != nil {
		log.Warn("could not tell whether an outbox table was added to the publication after the slot's position", "slot", cfg.Slot, "publication", cfg.Publication, "err", err)
		return nil
	}
	if len(tables) > 0 {
		log.Warn(replication.TablesAddedAfterSlotError(cfg.Slot, cfg.Publication, tables), "slot", cfg.Slot, "publication", cfg.Publication, "tables", strings.Join(tables, ","))
	}
	return nil
}

// checkInterval is how often a running relay checks the outbox's
// partitions and its publication.
var checkInterval = 5 * time.Second

// publicationChanged is the error of a publication changed under the
// running stream (WatchPublication's problems): the cause, and the way out
// for the rows passed over, from the time of the last check that found
// the publication right (since is zero before the first).
func publicationChanged(pub string, problems []string, tables []replication.Table, since time.Time) error {
	window := "--all"
	if !since.IsZero() {
		window = "--since " + since.UTC().Add(-time.Minute).Format(time.RFC3339) + " (or --all)"
	}
	var cmds []string
	for _, t := range tables {
		cmds = append(cmds, "walrelay reconcile --table "+shellquote.Arg(t.Schema+"."+t.Name)+" "+window+" --replay --yes")
	}
	return fmt.Errorf("%s: PostgreSQL passes over, without an error, every row written to an outbox table while the publication does not publish it, then and on every later read of the slot, "+
		"so walrelay stops. Put the publication right (walrelay check names the statement), start walrelay again, and republish from the table the rows missing from the topic: %s",
		strings.Join(problems, "; "), strings.Join(cmds, "; "))
}

// watchPublication takes the running relay's first reading of its
// publication (replication.WatchPublication), on a connection of its own,
// and refuses to stream when it finds a problem already.
func watchPublication(ctx context.Context, cfg *Config, tables []replication.Table) (replication.Membership, time.Time, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg.ConnConfig.Copy())
	if err != nil {
		return replication.Membership{}, time.Time{}, fmt.Errorf("connect to read publication %s: %w", cfg.Publication, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	m, problems, err := replication.WatchPublication(cctx, conn, cfg.Publication, tables, replication.Membership{})
	if err != nil {
		return m, time.Time{}, err
	}
	if len(problems) > 0 {
		return m, time.Time{}, publicationChanged(cfg.Publication, problems, tables, time.Time{})
	}
	return m, time.Now(), nil
}
