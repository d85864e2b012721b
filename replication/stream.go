package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/backoff"
)

// Kind says what a Change is.
type Kind int

const (
	// Data is an XLogData payload: one pgoutput message.
	Data Kind = iota + 1
	// Keepalive is a primary keepalive: every Data before it has been
	// yielded, so its WAL end is safe to confirm when nothing is in flight.
	Keepalive
	// TooLarge is an XLogData whose pgoutput message is larger than
	// MaxMessageBytes (Size is over it), which was never
	// held: Data is its pgoutput message cut down (each value of an insert
	// that did not fit given as NULL, a logical message's content cut
	// short, another message's first bytes), Size its size, Cuts the values
	// left out.
	TooLarge
)

// Change is what Session.Next yields.
type Change struct {
	Kind Kind
	// WALStart is the position of a Data message.
	WALStart pglogrepl.LSN
	// Data is the pgoutput message; valid only until the next call of
	// Next: whatever the caller keeps must be copied.
	Data []byte
	// WALEnd is a Keepalive's server WAL end.
	WALEnd pglogrepl.LSN
	// Size is a TooLarge message's size in bytes, and Cuts the values left
	// out of it.
	Size int64
	Cuts []Cut
}

// Config configures a Stream. Zero values mean the defaults.
type Config struct {
	// ConnString is a PostgreSQL connection string (URL or key=value) for
	// the database that holds the outbox; replication=database is added.
	// ConnConfig, if set, is used instead: a parsed configuration (a custom
	// dialer, a password fetched for each connection by a DialFunc or
	// ValidateConnect of your own); a copy of it gets replication=database
	// and the session settings.
	ConnString string
	ConnConfig *pgconn.Config
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
	// ReceiveTimeout ends a session from which nothing, not even a
	// keepalive, arrived for this long, as PostgreSQL's own
	// wal_receiver_timeout does: a server cut off without a FIN or RST
	// would otherwise leave the stream "streaming" until TCP gives up,
	// minutes later. Halfway through it, the status update asks the server
	// for a reply. Default 30s; at least 4 times StatusInterval. A message
	// still arriving counts as something.
	ReceiveTimeout time.Duration
	// MaxMessageBytes is the largest message of the server held in memory:
	// of an XLogData, its pgoutput message (the XLogData header's 25 bytes
	// not counted). A larger one is read as it arrives and dropped, its head kept
	// (Change.Kind TooLarge); a larger message of another kind ends the
	// session with a *ProtocolError. Default 16 MiB; at least 64.
	MaxMessageBytes int64
}

// DefaultMaxMessageBytes is Config.MaxMessageBytes's default.
const DefaultMaxMessageBytes = 16 << 20

// Stream is the source of one slot: Open starts a session (reconnecting
// with backoff while it cannot), and the session yields changes (Next) and
// takes the positions that may be confirmed (Confirm). One goroutine opens
// and reads; Confirm and the accessors are safe from any.
type Stream struct {
	cfg    Config
	log    *slog.Logger
	parsed *pgconn.Config

	received   atomic.Uint64 // highest WAL position received
	reconnects atomic.Uint64
	state      atomic.Value  // string
	confirmed  atomic.Uint64 // the last position a session of this process confirmed

	// Only the goroutine that opens sessions touches these.
	lastPID    uint32    // the server process (walsender) of the last session
	lastStart  string    // the server's backend_start of that walsender, as text
	history    string    // the server's system identifier and timeline at the last session
	ended      error     // why the last session or attempt ended; nil before the first
	began      time.Time // when the last session or attempt began
	progressed bool      // the last session confirmed past where it started
	attempt    int       // failed attempts in a row, for the backoff

	// A standby's wait for the slot, logged when it begins or its holder
	// changes and then every waitLogInterval, not at every try.
	waitPID    int       // the holder last logged
	waitSince  time.Time // when this wait for the slot began
	waitLogged time.Time // when it was last logged; zero: not waiting
}

// waitLogInterval is how often a wait for the slot held by the same
// process is logged again: a standby tries every StandbyRetry (a second),
// and a line a try would fill the log of a standby that waits for days.
const waitLogInterval = 10 * time.Minute

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
		return nil, fmt.Errorf("publication name %q: want 1 to 63 bytes of UTF-8 without a control character", cfg.Publication)
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
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.MaxMessageBytes < 64 {
		return nil, fmt.Errorf("max message bytes %d: want at least 64", cfg.MaxMessageBytes)
	}
	if cfg.ReceiveTimeout == 0 {
		cfg.ReceiveTimeout = max(30*time.Second, 4*cfg.StatusInterval)
	}
	if cfg.ReceiveTimeout < 4*cfg.StatusInterval {
		return nil, fmt.Errorf("receive timeout %s is under 4 times the status interval %s: the server answers a reply request with the next message, so allow it a few status intervals", cfg.ReceiveTimeout, cfg.StatusInterval)
	}
	var parsed *pgconn.Config
	var err error
	if cfg.ConnConfig != nil {
		parsed = replicationSession(cfg.ConnConfig.Copy())
	} else if parsed, err = ReplicationConfig(cfg.ConnString); err != nil {
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

// State returns what the stream is doing: "starting", "streaming",
// "waiting_for_slot", "reconnecting" or "stopped".
func (s *Stream) State() string { return s.state.Load().(string) }

// ReceivedLSN returns the highest WAL position received from the server.
func (s *Stream) ReceivedLSN() pglogrepl.LSN { return pglogrepl.LSN(s.received.Load()) }

// Reconnects returns how many times the stream was started again.
func (s *Stream) Reconnects() uint64 { return s.reconnects.Load() }

// Open starts a session from the slot's confirmed position (or the one this
// process confirmed, see resumeFrom). After a session or an attempt ended
// (Session.Close), it first waits, with capped exponential backoff and
// jitter (at most StandbyRetry while another process holds the slot), and
// logs why. Transient errors (connection lost, server restarting, the slot
// active in another process) are retried until ctx ends, which returns
// ctx's error; a fatal error (failure.IsFatal) is returned at once.
func (s *Stream) Open(ctx context.Context) (*Session, error) {
	return s.openLoop(ctx, false)
}

// OpenUnlessTaken is Open, but when another process streams the slot it
// returns that *SlotActiveError at once instead of waiting as a standby.
// The walsender of this stream's last session, which can outlive the
// session for a moment (or until wal_sender_timeout after a network cut),
// is waited for: it is not another process. The relay opens so after its
// producer was refused as fenced (exactly-once): a session means that no
// other instance streams the slot.
func (s *Stream) OpenUnlessTaken(ctx context.Context) (*Session, error) {
	return s.openLoop(ctx, true)
}

// openLoop is Open; unlessTaken returns a SlotActiveError of another
// process than the last session's walsender.
func (s *Stream) openLoop(ctx context.Context, unlessTaken bool) (*Session, error) {
	for {
		if s.ended != nil {
			if err := s.wait(ctx); err != nil {
				return nil, err
			}
			s.reconnects.Add(1)
		}
		s.began = time.Now()
		sess, err := s.open(ctx)
		if err == nil {
			s.waitLogged = time.Time{}
			return sess, nil
		}
		if failure.IsFatal(err) {
			s.state.Store("stopped")
			return nil, err
		}
		if ctx.Err() != nil {
			s.state.Store("stopped")
			return nil, ctx.Err()
		}
		s.ended, s.progressed = err, false
		var active *SlotActiveError
		// An unknown pid (the slot released as walrelay asked) is not
		// known to be another process's: the next attempt tells.
		if unlessTaken && errors.As(err, &active) && active.PID != 0 && uint32(active.PID) != s.lastPID {
			return nil, err
		}
	}
}

// wait sleeps before the next attempt, after logging why the last one
// ended.
func (s *Stream) wait(ctx context.Context) error {
	// A session that confirmed something, or streamed a while, resets the
	// backoff; one that failed at once (a restart that keeps failing) does
	// not.
	if s.progressed || time.Since(s.began) > 10*time.Second {
		s.attempt = 0
	}
	wait := backoff.Wait(s.cfg.BackoffMin, s.cfg.BackoffMax, s.attempt)
	s.attempt++
	var active *SlotActiveError
	if errors.As(s.ended, &active) {
		// A standby asks often, so that it takes over soon after the
		// holder dies: asking is one cheap query.
		wait = min(wait, s.cfg.StandbyRetry)
		s.state.Store("waiting_for_slot")
		now := time.Now()
		switch {
		case s.waitLogged.IsZero() || active.PID != s.waitPID:
			s.waitPID, s.waitSince, s.waitLogged = active.PID, now, now
			switch {
			case active.PID == 0:
				s.log.Info("slot was active in another process a moment ago; trying again", "retry_in", wait)
			case s.lastPID != 0 && uint32(active.PID) == s.lastPID:
				s.log.Info("slot is still held by the walsender of this walrelay's last session; waiting", "pid", active.PID, "retry_in", wait)
			default:
				s.log.Info("slot is active in another process; waiting, trying every "+s.cfg.StandbyRetry.String()+" (logged again every "+waitLogInterval.String()+")", "pid", active.PID)
			}
		case now.Sub(s.waitLogged) >= waitLogInterval:
			s.waitLogged = now
			s.log.Info("slot is still active in another process; waiting", "pid", active.PID, "waiting_for", now.Sub(s.waitSince).Round(time.Second))
		}
	} else {
		s.waitLogged = time.Time{}
		s.state.Store("reconnecting")
		s.log.Warn("replication stream failed; reconnecting", "err", s.ended, "retry_in", wait)
	}
	select {
	case <-ctx.Done():
		s.state.Store("stopped")
		return ctx.Err()
	case <-time.After(wait):
		return nil
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
		pgErr.Code == "0A000",               // feature not supported
		strings.HasPrefix(pgErr.Code, "28"), // invalid authorization (a hostile server may send a code of any length)
		pgErr.Code == "3D000",               // database does not exist
		strings.HasPrefix(pgErr.Code, "42"): // undefined object (slot, publication), insufficient privilege
		return true
	}
	return false
}

// open connects, checks the slot and starts replication.
func (s *Stream) open(ctx context.Context) (*Session, error) {
	// The frames of this connection: each connection gets a reader of its
	// own under pgproto3's (the last built is the one that connected).
	var frames *frameReader
	parsed := s.parsed.Copy()
	parsed.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		frames = newFrameReader(r, s.cfg.MaxMessageBytes)
		return pgproto3.NewFrontend(frames, w)
	}
	connectCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	conn, err := pgconn.ConnectConfig(connectCtx, parsed)
	cancel()
	if err != nil {
		if isFatalPgError(err) {
			return nil, failure.Mark(failure.Fatal, fmt.Errorf("connect for replication: %w", err))
		}
		return nil, fmt.Errorf("connect for replication: %w", err)
	}
	started := false
	defer func() {
		if !started {
			conn.Close(context.Background())
		}
	}()

	slot, err := inspectSlot(ctx, conn, s.cfg.Slot)
	if err != nil {
		return nil, err
	}
	if slot.WALStatus == "lost" {
		return nil, failure.Mark(failure.Fatal, fmt.Errorf("replication slot %s was invalidated (wal_status lost): the server removed WAL it still needed, "+
			"so events after %s may be missing from Kafka; drop and recreate the slot (walrelay slot drop --yes, slot create), then walrelay reconcile --since <a time before the loss> (--all on a table without created_at, outbox.timestamp_column or only UUIDv7 ids; walrelay migrate adds created_at) --replay --yes "+
			"republishes the rows missing from the topics (docs/operations.md: \"The slot was lost or dropped\")", s.cfg.Slot, slot.ConfirmedFlush))
	}
	if slot.Active && s.lastPID != 0 && s.lastStart != "" && uint32(slot.ActivePID) == s.lastPID {
		// This process's own last session, whose connection was lost
		// without the server hearing of it (a cut route, a NAT or load
		// balancer that dropped it): its walsender holds the slot until
		// wal_sender_timeout. Ended after a second (a session closed in
		// order releases the slot by then), not waited for.
		if slot, err = s.endOwnWalsender(ctx, conn, slot); err != nil {
			return nil, err
		}
	}
	if slot.Active {
		return nil, &SlotActiveError{Slot: s.cfg.Slot, PID: slot.ActivePID}
	}
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("identify system: %w", err)
	}
	history, err := walHistory(ctx, conn, sys)
	if err != nil {
		return nil, err
	}
	// The walsender's start names it beside its pid, which the server may
	// give to another process once it exited (endOwnWalsender). Unknown
	// (a server without pg_stat_activity), the walsender is never ended.
	backendStart := ""
	res, err := conn.Exec(ctx, "SELECT backend_start::text FROM pg_stat_activity WHERE pid = pg_backend_pid()").ReadAll()
	if err == nil && len(res) == 1 && len(res[0].Rows) == 1 && res[0].Rows[0][0] != nil {
		backendStart = string(res[0].Rows[0][0])
	} else if err != nil && conn.IsClosed() {
		return nil, fmt.Errorf("read the session's start: %w", err)
	}
	from := s.resumeFrom(sys, slot.ConfirmedFlush)
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
			return nil, s.slotActive(ctx, conn, pgErr)
		}
		if isFatalPgError(err) {
			return nil, failure.Mark(failure.Fatal, fmt.Errorf("start replication on slot %s: %w", s.cfg.Slot, err))
		}
		return nil, fmt.Errorf("start replication on slot %s: %w", s.cfg.Slot, err)
	}
	s.lastPID, s.lastStart = conn.PID(), backendStart
	s.state.Store("streaming")
	s.log.Info("streaming", "from", from.String(), "publication", s.cfg.Publication)
	s.received.Store(max(s.received.Load(), uint64(from)))
	s.confirmed.Store(uint64(from))
	sess := &Session{s: s, conn: conn, frames: frames, from: from, history: history, sent: from, statusErr: make(chan error, 1), stop: make(chan struct{})}
	sess.confirmed.Store(uint64(from))
	if err := sess.sendStatus(time.Now(), true); err != nil {
		return nil, err
	}
	sess.startStatus()
	started = true
	return sess, nil
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
	mine := pglogrepl.LSN(s.confirmed.Load())
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
