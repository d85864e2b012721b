package replication

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/sqlquote"
)

// SlotActiveError says that another process is streaming the slot.
type SlotActiveError struct {
	Slot string
	PID  int // 0 when unknown
}

func (e *SlotActiveError) Error() string {
	if e.PID == 0 {
		return fmt.Sprintf("replication slot %s is in use: another PostgreSQL walsender streams it to another client (its pid unknown: the slot was released before walrelay could read it)", e.Slot)
	}
	return fmt.Sprintf("replication slot %s is in use: PostgreSQL's walsender pid %d streams it to another client", e.Slot, e.PID)
}

// FailureKind says that the slot's holder may go: Open waits for it.
func (e *SlotActiveError) FailureKind() failure.Kind { return failure.Retriable }

// activePIDRe reads the holder's pid from the server's message in English
// ("replication slot \"s\" is active for PID N").
var activePIDRe = regexp.MustCompile(`active for PID (\d+)`)

// slotActive is the *SlotActiveError of a START_REPLICATION refused as the
// slot is active (55006, pgErr). The message names the holder's pid, but
// in the server's lc_messages ("Replikations-Slot »s« ist aktiv für PID
// N"), so the pid is read from pg_replication_slots on the same
// connection; from an English message when that query fails, and 0
// (unknown) when the slot was released in between.
func (s *Stream) slotActive(ctx context.Context, conn *pgconn.PgConn, pgErr *pgconn.PgError) *SlotActiveError {
	if readyAfterError(ctx, conn) == nil {
		if slot, err := inspectSlot(ctx, conn, s.cfg.Slot); err == nil {
			return &SlotActiveError{Slot: s.cfg.Slot, PID: slot.ActivePID}
		}
	}
	pid := 0
	if m := activePIDRe.FindStringSubmatch(pgErr.Message); m != nil {
		pid, _ = strconv.Atoi(m[1])
	}
	return &SlotActiveError{Slot: s.cfg.Slot, PID: pid}
}

// readyAfterError reads the ReadyForQuery that follows an ErrorResponse
// to START_REPLICATION: pglogrepl.StartReplication returns at the error,
// and a query sent before it is read would take it for its own end.
func readyAfterError(ctx context.Context, conn *pgconn.PgConn) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			return err
		}
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			return nil
		}
	}
}

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
