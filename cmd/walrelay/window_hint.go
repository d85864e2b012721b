package main

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/recovery"
)

// reconcileWindow is the window to name in a suggested reconcile of the
// rows committed after a moment that the operator knows (when: "a time
// before the loss"): "--since <when>" when every outbox table of cfg can
// place its rows in time (a created_at column, outbox.timestamp_column or
// only UUIDv7 ids), else "--all" and why, so that the command suggested
// runs on the table as it is. It reads the tables on a connection of its
// own (recovery.Open sets the session's formats); when it cannot, it
// names both. A table holding rows of unknown time (written before
// migrate added created_at, ids not UUIDv7: recovery.Table.Undated) gets
// --since with --all named for them.
func reconcileWindow(ctx context.Context, cfg *config.Config, connCfg *pgx.ConnConfig, when string) string {
	since := "--since <" + when + ">"
	generic := since + " (--all on a table without created_at, outbox.timestamp_column or only UUIDv7 ids; walrelay migrate adds created_at)"
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, connCfg.Copy())
	if err != nil {
		return generic
	}
	defer conn.Close(context.Background())
	undated := ""
	for _, l := range cfg.OutboxConfig().Layouts() {
		t, err := recovery.Open(ctx, conn, l)
		if err != nil {
			return generic
		}
		timed, err := t.Timed(ctx)
		if err != nil {
			return generic
		}
		if !timed {
			return "--all (" + t.Name() + " cannot place its rows in time: no created_at timestamptz, no outbox.timestamp_column, and ids that are not all UUIDv7; walrelay migrate adds created_at)"
		}
		if u, err := t.Undated(ctx); err == nil && u && undated == "" {
			undated = t.Name()
		}
	}
	if undated != "" {
		return since + " (rows of " + undated + " written before walrelay migrate added created_at, with ids that are not UUIDv7, are of unknown time and in no --since window: if they may be among them, --all)"
	}
	return since
}
