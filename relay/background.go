package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// heartbeat writes a non-transactional logical decoding message every
// interval, so that the slot has WAL of this database to move past even when
// only other databases on the server write. The decoder ignores them.
func heartbeat(ctx context.Context, connCfg *pgx.ConnConfig, prefix string, every time.Duration, log *slog.Logger) {
	Periodically(ctx, connCfg, every, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(false, $1, now()::text)", prefix)
		return err
	}, func(err error) { log.Warn("heartbeat failed", "err", err) })
}

// Periodically runs fn on a connection of its own every interval until ctx
// ends (first after one interval), connecting again after a failure, which
// it reports to onErr.
func Periodically(ctx context.Context, connCfg *pgx.ConnConfig, every time.Duration, fn func(context.Context, *pgx.Conn) error, onErr func(error)) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var err error
		if conn == nil || conn.IsClosed() {
			conn, err = pgx.ConnectConfig(qctx, connCfg.Copy())
		}
		if err == nil {
			err = fn(qctx, conn)
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			onErr(err)
			if conn != nil {
				conn.Close(context.Background())
				conn = nil
			}
		}
	}
}
