package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
)

// Session is one START_REPLICATION stream on one connection, from Open to
// Close. One goroutine calls Next and Close; Confirm is safe from any. A
// status goroutine sends standby status updates while the caller is busy
// between two Next calls (a Kafka outage), so that wal_sender_timeout does
// not end the session.
//
// Every write to the connection (a status update, CopyDone) goes through
// its pgproto3.Frontend, which is not safe for concurrent use, and happens
// under mu. The one writer outside mu is pgconn itself: a read that fails
// (other than by the read deadline) makes it close the connection in a
// goroutine of its own, which sends a cancel request and Terminate through
// the same frontend (PgConn.asyncClose). That happens only inside
// ReceiveMessage, called under mu, so under mu conn.IsClosed says exactly
// whether that goroutine may be running: a closed connection is never
// written to again (writable).
type Session struct {
	s       *Stream
	conn    *pgconn.PgConn
	frames  *frameReader // under conn's frontend
	from    pglogrepl.LSN
	history event.WALHistory // the server's WAL history at the start

	confirmed atomic.Uint64 // the highest position Confirm was given
	closed    atomic.Bool

	// mu is held by whoever does I/O on conn: Next, Close, the status
	// goroutine; none writes once pgconn closed conn (writable).
	mu           sync.Mutex
	sent         pglogrepl.LSN // highest flush LSN sent; starts at from
	lastSent     time.Time
	lastRecv     time.Time // since when the session waits for a message; zero: one just arrived
	lastBytes    int64     // frames.received when lastRecv was set
	pinged       bool      // a status update since lastRecv asked for a reply
	replyDue     bool      // the last keepalive asked for a reply: the next Next sends it
	readDeadline time.Time

	statusErr chan error
	stop      chan struct{}
	wg        sync.WaitGroup
}

// From returns the position the session resumed from: the server resends
// everything after it, so state of an earlier session (the decoder's
// relation cache, an open transaction, the checkpoint) must be reset to it.
func (ss *Session) From() pglogrepl.LSN { return ss.from }

// History returns the server's WAL history when the session started
// (IDENTIFY_SYSTEM and TIMELINE_HISTORY): no committed transaction of it
// lies beyond its flushed position, and positions recorded on an earlier
// timeline past that timeline's end are of WAL this server never had.
func (ss *Session) History() event.WALHistory { return ss.history }

// Confirm tells the session that every event up to lsn is acknowledged:
// the next status update confirms it. It never moves the position back, and
// a closed session ignores it (an acknowledgement of an earlier session must
// not reach a later one, whose WAL history may differ).
func (ss *Session) Confirm(lsn pglogrepl.LSN) {
	if ss.closed.Load() {
		return
	}
	raise(&ss.confirmed, lsn)
	raise(&ss.s.confirmed, lsn)
}

// raise sets p to lsn if that is higher.
func raise(p *atomic.Uint64, lsn pglogrepl.LSN) {
	for {
		old := p.Load()
		if uint64(lsn) <= old || p.CompareAndSwap(old, uint64(lsn)) {
			return
		}
	}
}

// startStatus starts the status goroutine.
func (ss *Session) startStatus() {
	ss.wg.Add(1)
	go func() {
		defer ss.wg.Done()
		t := time.NewTicker(ss.s.cfg.StatusInterval)
		defer t.Stop()
		for {
			select {
			case <-ss.stop:
				return
			case <-t.C:
				ss.mu.Lock()
				err := ss.sendStatus(time.Now(), false)
				ss.mu.Unlock()
				if errors.Is(err, errConnClosed) {
					return // Next returned why: the read that failed
				}
				if err != nil {
					ss.statusErr <- err
					return
				}
			}
		}
	}()
}

// sendStatus sends a standby status update when one is due: forced, after
// StatusInterval, or after a tenth of it when the confirmed LSN moved (so a
// crash during a fast catch-up replays less). mu must be held.
func (ss *Session) sendStatus(now time.Time, force bool) error {
	return ss.sendStatusReply(now, force, false)
}

// errConnClosed is the error of a write to a connection that pgconn
// closed after a failed read: the session is over.
var errConnClosed = fmt.Errorf("the connection was closed after a failed read: %w", net.ErrClosed)

// writable returns errConnClosed if pgconn closed the connection: its
// goroutine that sends Terminate may be using the frontend, which nothing
// else may touch from then on. mu must be held.
func (ss *Session) writable() error {
	if ss.conn.IsClosed() {
		return errConnClosed
	}
	return nil
}

// sendStatusReply is sendStatus, asking the server for an answer at once if
// reply (which forces the update).
func (ss *Session) sendStatusReply(now time.Time, force, reply bool) error {
	force = force || reply
	since := now.Sub(ss.lastSent)
	if !force && since < ss.s.cfg.StatusInterval/10 {
		return nil // not due whatever the position: skip reading it
	}
	pos := max(pglogrepl.LSN(ss.confirmed.Load()), ss.sent)
	if !force && since < ss.s.cfg.StatusInterval && pos == ss.sent {
		return nil
	}
	if err := ss.writable(); err != nil {
		return fmt.Errorf("send standby status update at %s: %w", pos, err)
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

// Next returns the next change: a Data message or a Keepalive, in WAL
// order. It wakes at least every tenth of StatusInterval to send a status
// update when one is due and to see whether ctx ended, which returns ctx's
// error (the session stays open: Close it, or call Next again with another
// context to read on, as a drain does). A session from which nothing arrived
// for ReceiveTimeout (time between two Next calls not counted) ends with an
// error. After any other error the session is over: Close it; a fatal one
// (failure.IsFatal) is one that retrying does not fix.
func (ss *Session) Next(ctx context.Context) (Change, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	cfg := &ss.s.cfg
	wake := cfg.StatusInterval / 10
	for {
		select {
		case err := <-ss.statusErr:
			return Change{}, err
		default:
		}
		if err := ss.writable(); err != nil {
			// Called again after the connection's end.
			return Change{}, fmt.Errorf("receive from slot %s: %w", cfg.Slot, err)
		}
		now := time.Now() // one clock read per message
		if ss.replyDue {
			// Asked for by the keepalive the caller has handled since.
			ss.replyDue = false
			if err := ss.sendStatus(now, true); err != nil {
				return Change{}, err
			}
		} else if err := ss.sendStatus(now, false); err != nil {
			return Change{}, err
		}
		if ss.lastRecv.IsZero() {
			ss.lastRecv = now
		}
		if silent := now.Sub(ss.lastRecv); silent > cfg.ReceiveTimeout {
			return Change{}, fmt.Errorf("receive from slot %s: nothing arrived for %s, not even a keepalive (postgres.receive_timeout): the server or the network is gone", cfg.Slot, silent.Round(time.Millisecond))
		} else if silent > cfg.ReceiveTimeout/2 && !ss.pinged {
			if err := ss.sendStatusReply(now, true, true); err != nil {
				return Change{}, err
			}
			ss.pinged = true
		}
		if err := ctx.Err(); err != nil {
			return Change{}, err
		}
		// A read deadline on the socket wakes the loop without a context
		// (and the goroutine pgconn starts to watch one) per message; it is
		// moved only when it has grown stale.
		if ss.readDeadline.Sub(now) < wake/2 {
			ss.readDeadline = now.Add(wake)
			if err := ss.conn.Conn().SetReadDeadline(ss.readDeadline); err != nil {
				return Change{}, fmt.Errorf("set read deadline: %w", err)
			}
		}
		raw, err := ss.conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) {
				ss.readDeadline = time.Time{}
				if n := ss.frames.received.Load(); n != ss.lastBytes {
					// A message still arriving (a large one, a slow
					// network): the server is there.
					ss.lastBytes, ss.lastRecv, ss.pinged = n, time.Now(), false
				}
				continue // the deadline: the loop top decides
			}
			if isFatalPgError(err) {
				return Change{}, failure.Mark(failure.Fatal, fmt.Errorf("receive from slot %s: %w", cfg.Slot, err))
			}
			if !connectionError(err) {
				var pe *ProtocolError
				if !errors.As(err, &pe) {
					err = &ProtocolError{Err: err} // pgproto3's: a message it cannot decode
				}
			}
			return Change{}, fmt.Errorf("receive from slot %s: %w", cfg.Slot, err)
		}
		// The silence starts at the next wait, after the caller: time it
		// spends waiting for Kafka is not the server's.
		ss.lastRecv, ss.pinged, ss.lastBytes = time.Time{}, false, ss.frames.received.Load()
		ch, ok, err := ss.change(raw)
		if err != nil || ok {
			return ch, err
		}
	}
}

// change reads one backend message; ok is false for one that yields no
// change (a notice, a parameter status).
func (ss *Session) change(raw pgproto3.BackendMessage) (Change, bool, error) {
	cfg := &ss.s.cfg
	var data []byte
	switch msg := raw.(type) {
	case *pgproto3.CopyData:
		data = msg.Data
	case *pgproto3.ErrorResponse:
		err := pgconn.ErrorResponseToPgError(msg)
		if pubErr := publicationVanished(err, cfg.Publication); pubErr != nil {
			return Change{}, false, failure.Mark(failure.Fatal, fmt.Errorf("stream from slot %s: %w", cfg.Slot, pubErr))
		}
		if isFatalPgError(err) {
			return Change{}, false, failure.Mark(failure.Fatal, fmt.Errorf("stream from slot %s: %w", cfg.Slot, err))
		}
		return Change{}, false, fmt.Errorf("stream from slot %s: %w", cfg.Slot, err)
	case *pgproto3.NoticeResponse:
		// PostgreSQL 18 skips a publication it cannot see as of a
		// transaction, with a WARNING, instead of failing: the rows of
		// that transaction would pass unpublished. The session asks for
		// warnings (ReceiveWarnings); the WARNING is known by its SQLSTATE
		// and the publication's name, its text being translated.
		if isPublicationSkipped(msg.Code, msg.Message, cfg.Publication) {
			return Change{}, false, failure.Mark(failure.Fatal, fmt.Errorf("stream from slot %s: %w", cfg.Slot, publicationSkipped(msg.Message, cfg.Publication)))
		}
		return Change{}, false, nil
	case *pgproto3.ParameterStatus:
		return Change{}, false, nil
	case *pgproto3.CopyDone, *pgproto3.CommandComplete:
		// A walsender that shuts down (the server stops or restarts)
		// ends the stream with CommandComplete "COPY 0", without a
		// CopyDone first (WalSndDone in walsender.c); one that ends it
		// from its side sends CopyDone.
		return Change{}, false, fmt.Errorf("stream from slot %s: %w", cfg.Slot, ErrServerEndedStream)
	default:
		return Change{}, false, fmt.Errorf("stream from slot %s: %w", cfg.Slot, &ProtocolError{Err: fmt.Errorf("unexpected message %T", raw)})
	}
	if len(data) == 0 {
		return Change{}, false, &ProtocolError{Err: errors.New("empty CopyData")}
	}
	switch data[0] {
	case tooLargeTag:
		o, ok := ss.frames.take()
		if !ok || len(data) != 1 {
			return Change{}, false, &ProtocolError{Err: errNoStandIn}
		}
		if end := uint64(o.walStart) + uint64(o.size); end > ss.s.received.Load() {
			ss.s.received.Store(end)
		}
		return Change{Kind: TooLarge, WALStart: o.walStart, Data: o.head, Size: o.size, Cuts: o.cuts}, true, nil
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return Change{}, false, &ProtocolError{Err: fmt.Errorf("parse keepalive: %w", err)}
		}
		if ka.ServerWALEnd > ss.s.ReceivedLSN() {
			ss.s.received.Store(uint64(ka.ServerWALEnd))
		}
		ss.replyDue = ss.replyDue || ka.ReplyRequested
		return Change{Kind: Keepalive, WALEnd: ka.ServerWALEnd}, true, nil
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return Change{}, false, &ProtocolError{Err: fmt.Errorf("parse xlogdata: %w", err)}
		}
		if end := uint64(xld.WALStart) + uint64(len(xld.WALData)); end > ss.s.received.Load() {
			ss.s.received.Store(end)
		}
		return Change{Kind: Data, WALStart: xld.WALStart, Data: xld.WALData}, true, nil
	}
	return Change{}, false, nil
}

// connectionError reports whether err is the connection's end or failure
// (EOF, a reset, a closed socket), not a message that could not be read.
func connectionError(err error) bool {
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.ErrClosedPipe) || errors.As(err, &ne)
}

// Close ends the session. With a nil reason it is a clean stop: the last
// status update confirms what Confirm was given, and the copy stream ends;
// its failures are logged, not returned (the next start resends the tail).
// Otherwise reason is why the session ended, which the next Open logs
// before it waits. Close is idempotent.
func (ss *Session) Close(reason error) {
	if !ss.closed.CompareAndSwap(false, true) {
		return
	}
	close(ss.stop)
	ss.wg.Wait()
	s := ss.s
	ss.mu.Lock()
	if reason == nil && ss.writable() != nil {
		s.log.Warn("the connection was lost before the stop: no last status update; the tail of the stream will be sent again on the next start", "confirmed", ss.sent.String())
	} else if reason == nil {
		_ = ss.conn.Conn().SetDeadline(time.Now().Add(5 * time.Second))
		if err := ss.sendStatus(time.Now(), true); err != nil {
			s.log.Warn("last status update failed; the tail of the stream will be sent again on the next start", "err", err)
		} else {
			s.log.Info("stopped", "confirmed", ss.sent.String())
		}
		if _, err := pglogrepl.SendStandbyCopyDone(context.Background(), ss.conn); err != nil {
			s.log.Debug("end copy stream", "err", err)
		}
	}
	ss.mu.Unlock()
	ss.conn.Close(context.Background())
	s.ended, s.progressed = reason, ss.sent > ss.from
	if reason == nil {
		s.state.Store("stopped")
	} else {
		s.state.Store("reconnecting")
	}
}
