package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// session is one START_REPLICATION stream on one connection. mu is held by
// whoever does I/O on conn: the receive loop, except while it is inside the
// Handler, and the status goroutine.
type session struct {
	s        *Stream
	conn     *pgconn.PgConn
	mu       sync.Mutex
	sent     pglogrepl.LSN // highest flush LSN sent; starts at the slot's
	lastSent time.Time
	lastRecv time.Time // since when the session waits for a message; zero: one just arrived
	pinged   bool      // a status update since lastRecv asked for a reply
}

// sendStatus sends a standby status update when one is due: forced, after
// StatusInterval, or after a tenth of it when the confirmed LSN moved (so a
// crash during a fast catch-up replays less). mu must be held.
func (ss *session) sendStatus(now time.Time, force bool) error {
	return ss.sendStatusReply(now, force, false)
}

// sendStatusReply is sendStatus, asking the server for an answer at once if
// reply (which forces the update).
func (ss *session) sendStatusReply(now time.Time, force, reply bool) error {
	force = force || reply
	since := now.Sub(ss.lastSent)
	if !force && since < ss.s.cfg.StatusInterval/10 {
		return nil // not due whatever the position: skip reading it
	}
	pos := max(ss.s.cfg.SafePosition(), ss.sent)
	if !force && since < ss.s.cfg.StatusInterval && pos == ss.sent {
		return nil
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), ss.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pos, WALFlushPosition: pos, WALApplyPosition: pos, ReplyRequested: reply,
	})
	if err != nil {
		return fmt.Errorf("send standby status update at %s: %w", pos, err)
	}
	ss.sent = pos
	ss.lastSent = now
	return nil
}

func (ss *session) run(ctx context.Context) error {
	cfg := &ss.s.cfg
	// The status goroutine keeps the session alive while the Handler blocks.
	statusErr := make(chan error, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(cfg.StatusInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				ss.mu.Lock()
				err := ss.sendStatus(time.Now(), false)
				ss.mu.Unlock()
				if err != nil {
					statusErr <- err
					return
				}
			}
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
	}()

	ss.mu.Lock()
	defer ss.mu.Unlock()
	if err := ss.sendStatus(time.Now(), true); err != nil {
		return err
	}
	var drainUntil time.Time // set once ctx is cancelled
	var readDeadline time.Time
	ss.lastRecv = time.Now()
	wake := cfg.StatusInterval / 10
	defer ss.conn.Conn().SetReadDeadline(time.Time{}) //nolint:errcheck // best effort for the shutdown's own deadline
	for {
		select {
		case err := <-statusErr:
			return err
		default:
		}
		now := time.Now() // one clock read per message
		if err := ss.sendStatus(now, false); err != nil {
			return err
		}
		if ss.lastRecv.IsZero() {
			ss.lastRecv = now
		}
		if silent := now.Sub(ss.lastRecv); silent > cfg.ReceiveTimeout {
			return fmt.Errorf("receive from slot %s: nothing arrived for %s, not even a keepalive (postgres.receive_timeout): the server or the network is gone", cfg.Slot, silent.Round(time.Millisecond))
		} else if silent > cfg.ReceiveTimeout/2 && !ss.pinged {
			if err := ss.sendStatusReply(now, true, true); err != nil {
				return err
			}
			ss.pinged = true
		}
		if cfg.Err != nil {
			if err := handlerError(cfg.Err()); err != nil {
				return err
			}
		}
		if ctx.Err() != nil {
			if drainUntil.IsZero() {
				drainUntil = time.Now().Add(cfg.DrainTimeout)
			}
			if cfg.BetweenTransactions == nil || cfg.BetweenTransactions() {
				return ss.shutdown(drainUntil)
			}
			if time.Now().After(drainUntil) {
				ss.s.log.Warn("stopping inside a transaction: its events will be sent again on the next start")
				return ss.shutdown(drainUntil)
			}
			// Otherwise read on to the end of the transaction.
		}
		// Wake at least every tenth of the interval to see whether a status
		// update is due or ctx is done; data wakes it sooner. A read
		// deadline on the socket does this without a context (and the
		// goroutine pgconn starts to watch one) per message; it is moved
		// only when it has grown stale.
		if readDeadline.Sub(now) < wake/2 {
			readDeadline = now.Add(wake)
			if err := ss.conn.Conn().SetReadDeadline(readDeadline); err != nil {
				return fmt.Errorf("set read deadline: %w", err)
			}
		}
		raw, err := ss.conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) {
				readDeadline = time.Time{}
				continue // the deadline: the loop top decides
			}
			if isFatalPgError(err) {
				return &FatalError{fmt.Errorf("receive from slot %s: %w", cfg.Slot, err)}
			}
			return fmt.Errorf("receive from slot %s: %w", cfg.Slot, err)
		}
		// The silence starts at the next loop top, after the Handler: time
		// it spends waiting for Kafka is not the server's.
		ss.lastRecv, ss.pinged = time.Time{}, false
		if err := ss.message(ctx, raw); err != nil {
			return err
		}
	}
}

func (ss *session) message(ctx context.Context, raw pgproto3.BackendMessage) error {
	cfg := &ss.s.cfg
	var data []byte
	switch msg := raw.(type) {
	case *pgproto3.CopyData:
		data = msg.Data
	case *pgproto3.ErrorResponse:
		err := pgconn.ErrorResponseToPgError(msg)
		if isFatalPgError(err) {
			return &FatalError{fmt.Errorf("stream from slot %s: %w", cfg.Slot, err)}
		}
		return fmt.Errorf("stream from slot %s: %w", cfg.Slot, err)
	case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus:
		return nil
	case *pgproto3.CopyDone:
		return fmt.Errorf("stream from slot %s: server ended the copy stream", cfg.Slot)
	default:
		return fmt.Errorf("stream from slot %s: unexpected message %T", cfg.Slot, raw)
	}
	if len(data) == 0 {
		return errors.New("replication stream: empty CopyData")
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		if ka.ServerWALEnd > ss.s.ReceivedLSN() {
			ss.s.received.Store(uint64(ka.ServerWALEnd))
		}
		if cfg.Keepalive != nil {
			cfg.Keepalive(ka.ServerWALEnd)
		}
		if ka.ReplyRequested {
			return ss.sendStatus(time.Now(), true)
		}
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parse xlogdata: %w", err)
		}
		if end := uint64(xld.WALStart) + uint64(len(xld.WALData)); end > ss.s.received.Load() {
			ss.s.received.Store(end)
		}
		ss.mu.Unlock()
		err = cfg.Handle(ctx, xld.WALStart, xld.WALData)
		ss.mu.Lock()
		if err := handlerError(err); err != nil {
			return err
		}
	}
	return nil
}

// handlerError classifies an error of the Handler or of Config.Err.
func handlerError(err error) error {
	if err == nil || errors.Is(err, ErrRestart) {
		return err
	}
	return &FatalError{err}
}

// shutdown waits for in-flight events, sends the last status update and ends
// the copy stream, all on a fresh context: ctx is already cancelled. Its
// failures are logged, not returned: the next start resends the tail.
func (ss *session) shutdown(until time.Time) error {
	cfg := &ss.s.cfg
	if cfg.Flush != nil {
		ss.mu.Unlock() // the status goroutine keeps the session alive meanwhile
		fctx, cancel := context.WithDeadline(context.Background(), until.Add(time.Second))
		if err := cfg.Flush(fctx); err != nil {
			ss.s.log.Warn("events still in flight at shutdown; they will be sent again on the next start", "err", err)
		}
		cancel()
		ss.mu.Lock()
	}
	_ = ss.conn.Conn().SetDeadline(time.Now().Add(5 * time.Second))
	if err := ss.sendStatus(time.Now(), true); err != nil {
		ss.s.log.Warn("last status update failed; the tail of the stream will be sent again on the next start", "err", err)
	} else {
		ss.s.log.Info("stopped", "confirmed", ss.sent.String())
	}
	if _, err := pglogrepl.SendStandbyCopyDone(context.Background(), ss.conn); err != nil {
		ss.s.log.Debug("end copy stream", "err", err)
	}
	return nil
}
