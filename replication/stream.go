package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/walrelay/walrelay/internal/backoff"
)

// Handler is called from the receive goroutine with each XLogData payload,
// in WAL order. data is valid only until it returns: whatever it keeps must be
// copied. It may block (backpressure); status updates go on meanwhile. An
// error wrapping ErrRestart ends the session, and the stream reconnects and
// resends from the slot's confirmed position; any other error stops the
// stream for good and is returned by Run.
type Handler func(ctx context.Context, walStart pglogrepl.LSN, data []byte) error

// ErrRestart, wrapped in an error of a Handler or of Config.Err, asks for the
// stream to start again from the slot's confirmed position: the way to retry
// events that could not be delivered without giving up their order.
var ErrRestart = errors.New("restart the replication stream")

// Confirmed returns the LSN that may be confirmed to the server. It is called
// from several goroutines.
type Confirmed func() pglogrepl.LSN

// Keepalive is called from the receive goroutine with a keepalive's WAL end,
// after every XLogData received before it went through the Handler.
type Keepalive func(serverWALEnd pglogrepl.LSN)

// Config configures a Stream. Zero values mean the defaults.
type Config struct {
	// ConnString is a PostgreSQL connection string (URL or key=value) for
	// the database that holds the outbox; replication=database is added.
	ConnString string
	// Slot is the logical replication slot. Default "walrelay".
	Slot string
	// Publication is the pgoutput publication. Default "walrelay_outbox".
	Publication string
	// StatusInterval is the longest time between standby status updates.
	// Default 1s; at most 30s.
	StatusInterval time.Duration
	// BackoffMin and BackoffMax bound the wait before reconnecting; the wait
	// doubles per failed attempt, with jitter. Defaults 100ms and 10s.
	BackoffMin, BackoffMax time.Duration
	// StandbyRetry caps the wait between two tries while another process
	// holds the slot. Default 1s.
	StandbyRetry time.Duration
	// Logger receives lifecycle logs. Nil discards them.
	Logger *slog.Logger

	// Handle receives each XLogData payload. Required.
	Handle Handler
	// Confirmed gives the LSN for status updates. Required.
	Confirmed Confirmed
	// Keepalive, if set, receives each keepalive's WAL end.
	Keepalive Keepalive
	// Started, if set, is called before each stream starts (the first and
	// every reconnect) with the position it starts from: the slot's
	// confirmed_flush_lsn, or what Confirmed returns if that is further on
	// the same WAL history (see Stream.resumeFrom). The server resends
	// everything after it, so state of an earlier stream (the decoder's
	// relation cache, an open transaction, the checkpoint) must be reset.
	// It may wait, within ctx, for the earlier stream's events to settle; an
	// error ends this session and it is tried again.
	Started func(ctx context.Context, from pglogrepl.LSN) error
	// Flush, if set, is called once when Run stops, before the last status
	// update, to wait (within ctx) for events still in flight.
	Flush func(ctx context.Context) error
	// Boundary, if set, reports whether the stream is between transactions.
	// When ctx is cancelled the stream goes on reading, for up to
	// DrainTimeout, until it is: a clean stop that split a transaction would
	// confirm none of it and publish its first part again on the next start.
	Boundary func() bool
	// DrainTimeout bounds that wait and the Flush. Default 30s.
	DrainTimeout time.Duration
	// ReceiveTimeout ends a session from which nothing, not even a
	// keepalive, arrived for this long, as PostgreSQL's own
	// wal_receiver_timeout does: a server cut off without a FIN or RST
	// would otherwise leave the stream "streaming" until TCP gives up,
	// minutes later. Halfway through it, the status update asks the server
	// for a reply. Default 30s; at least 4 times StatusInterval.
	ReceiveTimeout time.Duration
	// Err, if set, is polled by the receive loop at least every tenth of
	// StatusInterval; a non-nil error ends the session as a Handler's would.
	Err func() error
}

// Stream streams one slot. Create it with New and call Run once.
type Stream struct {
	cfg    Config
	log    *slog.Logger
	parsed *pgconn.Config

	received   atomic.Uint64 // highest WAL position received
	reconnects atomic.Uint64
	state      atomic.Value // string

	// history is the server's system identifier and timeline at the last
	// session; only the stream goroutine touches it.
	history string
}

// SlotActiveError says that another process is streaming the slot.
type SlotActiveError struct {
	Slot string
	PID  int // 0 when unknown
}

func (e *SlotActiveError) Error() string {
	return fmt.Sprintf("replication slot %s is active in process %d", e.Slot, e.PID)
}

// FatalError wraps an error that retrying cannot fix: Run returns it.
type FatalError struct{ Err error }

func (e *FatalError) Error() string { return e.Err.Error() }
func (e *FatalError) Unwrap() error { return e.Err }

var identRe = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// ValidSlotName reports whether s is usable as a replication slot name:
// PostgreSQL allows lower-case letters, digits and underscores, 1 to 63.
func ValidSlotName(s string) bool { return identRe.MatchString(s) }

// New checks cfg and fills its defaults.
func New(cfg Config) (*Stream, error) {
	if cfg.Slot == "" {
		cfg.Slot = "walrelay"
	}
	if cfg.Publication == "" {
		cfg.Publication = "walrelay_outbox"
	}
	if !ValidSlotName(cfg.Slot) {
		return nil, fmt.Errorf("slot name %q: use 1 to 63 lower-case letters, digits and underscores", cfg.Slot)
	}
	if !ValidPublicationName(cfg.Publication) {
		return nil, fmt.Errorf("publication name %q: want 1 to 63 bytes", cfg.Publication)
	}
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = time.Second
	}
	if cfg.StatusInterval < 10*time.Millisecond || cfg.StatusInterval > 30*time.Second {
		return nil, fmt.Errorf("status interval %s: want 10ms to 30s", cfg.StatusInterval)
	}
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin = 100 * time.Millisecond
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = 10 * time.Second
	}
	if cfg.StandbyRetry == 0 {
		cfg.StandbyRetry = time.Second
	}
	if cfg.BackoffMin > cfg.BackoffMax {
		return nil, fmt.Errorf("backoff min %s is above backoff max %s", cfg.BackoffMin, cfg.BackoffMax)
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.ReceiveTimeout == 0 {
		cfg.ReceiveTimeout = max(30*time.Second, 4*cfg.StatusInterval)
	}
	if cfg.ReceiveTimeout < 4*cfg.StatusInterval {
		return nil, fmt.Errorf("receive timeout %s is under 4 times the status interval %s: the server answers a reply request with the next message, so allow it a few status intervals", cfg.ReceiveTimeout, cfg.StatusInterval)
	}
	if cfg.Handle == nil || cfg.Confirmed == nil {
		return nil, errors.New("replication config: Handle and Confirmed are required")
	}
	parsed, err := ReplicationConfig(cfg.ConnString)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Stream{cfg: cfg, parsed: parsed, log: log.With("component", "replication", "slot", cfg.Slot)}
	s.state.Store("starting")
	return s, nil
}

// ReplicationConfig parses connString for a replication=database session
// with the pinned session settings of the package documentation.
func ReplicationConfig(connString string) (*pgconn.Config, error) {
	c, err := pgconn.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("parse postgres dsn: %w", err)
	}
	c.RuntimeParams["replication"] = "database"
	for k, v := range SessionParams {
		c.RuntimeParams[k] = v
	}
	if c.RuntimeParams["application_name"] == "" {
		c.RuntimeParams["application_name"] = "walrelay"
	}
	return c, nil
}

// SessionParams are the settings pinned on every session, so that text
// values have one form whatever the server's defaults.
var SessionParams = map[string]string{
	"DateStyle":          "ISO",
	"TimeZone":           "UTC",
	"extra_float_digits": "3",
	"bytea_output":       "hex",
	"IntervalStyle":      "postgres",
}

// State returns what the stream is doing: "starting", "streaming",
// "waiting_for_slot", "reconnecting" or "stopped".
func (s *Stream) State() string { return s.state.Load().(string) }

// ReceivedLSN returns the highest WAL position received from the server.
func (s *Stream) ReceivedLSN() pglogrepl.LSN { return pglogrepl.LSN(s.received.Load()) }

// Reconnects returns how many times the stream was started again.
func (s *Stream) Reconnects() uint64 { return s.reconnects.Load() }

// Run streams until ctx is cancelled (it then returns nil) or a fatal error
// occurs. Transient errors (connection lost, server restarting, the slot
// active in another process) are retried forever with backoff.
func (s *Stream) Run(ctx context.Context) error {
	defer s.state.Store("stopped")
	attempt := 0
	for {
		began := time.Now()
		started, err := s.stream(ctx)
		var fatal *FatalError
		if errors.As(err, &fatal) {
			// Also during the drain after ctx was cancelled: a stop that
			// did not finish cleanly must not report success.
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		// A session that streamed a while resets the backoff; one that
		// failed at once (a restart that keeps failing) does not.
		if started && time.Since(began) > 10*time.Second {
			attempt = 0
		}
		wait := backoff.Wait(s.cfg.BackoffMin, s.cfg.BackoffMax, attempt)
		attempt++
		var active *SlotActiveError
		if errors.As(err, &active) {
			// A standby asks often, so that it takes over soon after the
			// holder dies: asking is one cheap query.
			wait = min(wait, s.cfg.StandbyRetry)
			s.state.Store("waiting_for_slot")
			s.log.Info("slot is active in another process; waiting", "pid", active.PID, "retry_in", wait)
		} else {
			s.state.Store("reconnecting")
			s.log.Warn("replication stream failed; reconnecting", "err", err, "retry_in", wait)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		s.reconnects.Add(1)
	}
}

// fatalCodes are SQLSTATEs that retrying does not fix.
func isFatalPgError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch {
	case pgErr.Code == "55006": // object in use: the slot is active
		return false
	case pgErr.Code == "55000", // object not in prerequisite state: wal_level, invalidated slot
		pgErr.Code == "0A000",  // feature not supported
		pgErr.Code[:2] == "28", // invalid authorization
		pgErr.Code == "3D000",  // database does not exist
		pgErr.Code[:2] == "42": // undefined object (slot, publication), insufficient privilege
		return true
	}
	return false
}

var activePIDRe = regexp.MustCompile(`active for PID (\d+)`)

// stream runs one replication session. started reports whether streaming
// began, which resets the backoff.
func (s *Stream) stream(ctx context.Context) (started bool, err error) {
	connectCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	conn, err := pgconn.ConnectConfig(connectCtx, s.parsed)
	cancel()
	if err != nil {
		if isFatalPgError(err) {
			return false, &FatalError{fmt.Errorf("connect for replication: %w", err)}
		}
		return false, fmt.Errorf("connect for replication: %w", err)
	}
	defer conn.Close(context.Background())

	slot, err := inspectSlot(ctx, conn, s.cfg.Slot)
	if err != nil {
		return false, err
	}
	if slot.WALStatus == "lost" {
		return false, &FatalError{fmt.Errorf("replication slot %s was invalidated (wal_status lost): the server removed WAL it still needed, "+
			"so events after %s may be missing from Kafka; drop and recreate the slot, then replay the outbox table from that position", s.cfg.Slot, slot.ConfirmedFlush)}
	}
	if slot.Active {
		return false, &SlotActiveError{Slot: s.cfg.Slot, PID: slot.ActivePID}
	}
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return false, fmt.Errorf("identify system: %w", err)
	}
	from := s.resumeFrom(sys, slot.ConfirmedFlush)
	if s.cfg.Started != nil {
		if err := s.cfg.Started(ctx, from); err != nil {
			return false, err
		}
	}
	err = pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, from, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			// pgoutput splits the list as identifiers: quoted, a name
			// keeps its case and punctuation.
			"publication_names " + quoteLiteral(pgx.Identifier{s.cfg.Publication}.Sanitize()),
			"messages 'true'",
		},
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" {
			pid := 0
			if m := activePIDRe.FindStringSubmatch(pgErr.Message); m != nil {
				pid, _ = strconv.Atoi(m[1])
			}
			return false, &SlotActiveError{Slot: s.cfg.Slot, PID: pid}
		}
		if isFatalPgError(err) {
			return false, &FatalError{fmt.Errorf("start replication on slot %s: %w", s.cfg.Slot, err)}
		}
		return false, fmt.Errorf("start replication on slot %s: %w", s.cfg.Slot, err)
	}
	s.state.Store("streaming")
	s.log.Info("streaming", "from", from.String(), "publication", s.cfg.Publication)
	sess := &session{s: s, conn: conn, sent: from}
	s.received.Store(max(s.received.Load(), uint64(from)))
	return true, sess.run(ctx)
}

// resumeFrom returns where a session starts: the slot's confirmed position,
// or the position this process confirmed if that is further on the same
// server and timeline. PostgreSQL before 17 writes a logical slot's confirmed
// position to disk only when its restart point moves, not at shutdown, so
// after a server restart the slot can be seconds of events behind what
// walrelay confirmed; asking for the later position makes the server skip
// the transactions that committed before it instead of resending them. The
// process's position is trusted only where it is the same WAL: the same
// system identifier and timeline as at the previous session, and not past the
// WAL the server has flushed. A restored or promoted server resumes from its
// slot.
func (s *Stream) resumeFrom(sys pglogrepl.IdentifySystemResult, slotConfirmed pglogrepl.LSN) pglogrepl.LSN {
	history := fmt.Sprintf("system %s timeline %d", sys.SystemID, sys.Timeline)
	was := s.history
	// From here on the tracker confirms positions of this history: the
	// session starts at the slot's position whenever the history changed.
	s.history = history
	mine := s.cfg.Confirmed()
	switch {
	case mine <= slotConfirmed:
		return slotConfirmed
	case was != history || mine > sys.XLogPos:
		s.log.Warn("the server's WAL history is not the one walrelay confirmed positions on; resuming from the slot's position, which resends what it confirmed since",
			"was", was, "now", history, "confirmed", mine.String(), "server_flushed", sys.XLogPos.String(), "slot_confirmed", slotConfirmed.String())
		return slotConfirmed
	}
	s.log.Info("resuming after the slot's saved position, from the one confirmed before the reconnect", "slot_confirmed", slotConfirmed.String(), "from", mine.String())
	return mine
}

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
	pos := max(ss.s.cfg.Confirmed(), ss.sent)
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
			if cfg.Boundary == nil || cfg.Boundary() {
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
