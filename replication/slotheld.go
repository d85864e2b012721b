package replication

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/sqlquote"
)

// SlotActiveError says that another process is streaming the slot.
type SlotActiveError struct {
	Slot string
	PID  int // 0 when unknown
}

func (e *SlotActiveError) Error() string {
	return fmt.Sprintf("replication slot %s is in use: PostgreSQL's walsender pid %d streams it to another client", e.Slot, e.PID)
}

// FailureKind says that the slot's holder may go: Open waits for it.
func (e *SlotActiveError) FailureKind() failure.Kind { return failure.Retriable }

var activePIDRe = regexp.MustCompile(`active for PID (\d+)`)

// endOwnWalsender ends the walsender of this process's last session, which
// still holds the slot (slot.ActivePID is the last session's), and returns
// the slot as it is then: inactive once that walsender exited. It is ended
// only if it is the last session's process (the same pid and start): a pid
// the server gave since to another process is left alone. Ending it needs
// the same role as the session's or pg_signal_backend; refused, the slot
// is returned still active and waited for as before.
func (s *Stream) endOwnWalsender(ctx context.Context, conn *pgconn.PgConn, slot SlotInfo) (SlotInfo, error) {
	// A session closed in order: its walsender exits a moment later.
	slot, err := s.slotReleased(ctx, conn, slot, time.Second)
	if err != nil || !slot.Active || uint32(slot.ActivePID) != s.lastPID {
		return slot, err
	}
	res, err := conn.Exec(ctx, fmt.Sprintf("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = %d AND backend_start::text = %s",
		slot.ActivePID, sqlquote.Literal(s.lastStart))).ReadAll()
	done := err == nil && len(res) == 1 && len(res[0].Rows) == 1 && string(res[0].Rows[0][0]) == "t"
	if !done {
		why := "that pid is another process now"
		if err != nil {
			why = err.Error()
		}
		s.log.Warn("the slot is still held by this walrelay's last session, whose connection was lost; its walsender was not ended: the server ends it within wal_sender_timeout",
			"pid", slot.ActivePID, "why", why)
		return slot, nil
	}
	s.log.Warn("the slot was still held by this walrelay's last session, whose connection was lost: its walsender ended", "pid", slot.ActivePID)
	// The walsender releases the slot as it exits, a moment later.
	return s.slotReleased(ctx, conn, slot, 5*time.Second)
}

// slotReleased inspects the slot every 50 ms until it is inactive, for at
// most wait, and returns it as it is then.
func (s *Stream) slotReleased(ctx context.Context, conn *pgconn.PgConn, slot SlotInfo, wait time.Duration) (SlotInfo, error) {
	for deadline := time.Now().Add(wait); slot.Active && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return slot, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		var err error
		if slot, err = inspectSlot(ctx, conn, s.cfg.Slot); err != nil {
			return slot, err
		}
	}
	return slot, nil
}
