package replication

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/internal/testkit/pgtest"
)

// serverConn gives a test a server and a connection to it, closed when the
// test ends.
func serverConn(t *testing.T) (*pgtest.Server, *pgx.Conn) {
	t.Helper()
	pg := pgtest.Start(t)
	return pg, pgtest.Connect(t, pg.DSN)
}

// execer returns a function that runs sql on conn and fails the test,
// naming the SQL, on an error.
func execer(t *testing.T, conn *pgx.Conn) func(sql string) {
	return func(sql string) {
		t.Helper()
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// streamed gives a test a server with an outbox, its publication and slot,
// and one committed transaction of rows rows after the slot.
func streamed(t *testing.T, rows int) *pgtest.Server {
	t.Helper()
	pg, conn := serverConn(t)
	ctx := t.Context()
	if _, err := conn.Exec(ctx, "CREATE TABLE outbox (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := EnsurePublication(ctx, conn, Outbox{Publication: "walrelay_outbox", Tables: []Table{{Schema: "public", Name: "outbox"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureSlot(ctx, conn, "walrelay", "walrelay_outbox", false); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO outbox SELECT generate_series(1, $1)", rows); err != nil {
		t.Fatal(err)
	}
	return pg
}

// TestSessionYieldsAndConfirms: a session yields the transaction's messages
// in WAL order, a clean Close confirms what Confirm was given (and nothing
// more), and the next session resumes from there; a Confirm after Close is
// ignored.
func TestSessionYieldsAndConfirms(t *testing.T) {
	t.Parallel()
	pg := streamed(t, 10)
	ctx := t.Context()
	s, err := New(Config{ConnString: pg.DSN})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := s.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []byte
	var commitEnd pglogrepl.LSN
	for commitEnd == 0 {
		ch, err := sess.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ch.Kind != Data {
			continue
		}
		kinds = append(kinds, ch.Data[0])
		if ch.Data[0] == 'C' {
			m, err := pglogrepl.Parse(ch.Data)
			if err != nil {
				t.Fatal(err)
			}
			commitEnd = m.(*pglogrepl.CommitMessage).TransactionEndLSN
		}
	}
	if got := string(kinds); got != "BRIIIIIIIIIIC" {
		t.Fatalf("messages %q, want begin, relation, ten inserts, commit", got)
	}
	sess.Confirm(commitEnd)
	sess.Close(nil)
	sess.Confirm(commitEnd + 100) // closed: ignored
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var confirmed string
	if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'walrelay'").Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	if confirmed != commitEnd.String() {
		t.Fatalf("slot confirmed %s, want the commit's end %s", confirmed, commitEnd)
	}
	again, err := s.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close(errors.New("test over"))
	if again.From() != commitEnd {
		t.Fatalf("the next session resumes from %s, want %s", again.From(), commitEnd)
	}
}

// TestReceiveTimeoutMustAllowStatusIntervals: a receive timeout that leaves
// the server less than four status intervals to answer a reply request is
// refused.
func TestReceiveTimeoutMustAllowStatusIntervals(t *testing.T) {
	t.Parallel()
	_, err := New(Config{ConnString: "postgres://x@localhost/db", StatusInterval: time.Second, ReceiveTimeout: 2 * time.Second})
	if err == nil {
		t.Fatal("a receive timeout of 2 status intervals was accepted")
	}
}

// TestResumeFrom: a session starts at the slot's confirmed position, or at
// the position this process confirmed when that is further on the same
// system, timeline and flushed WAL; a changed history (another system, a
// new timeline) or a position past the server's flushed WAL falls back to
// the slot, and so does the first session, whose history is not known yet.
func TestResumeFrom(t *testing.T) {
	t.Parallel()
	sys := func(id string, tl int32, flushed pglogrepl.LSN) pglogrepl.IdentifySystemResult {
		return pglogrepl.IdentifySystemResult{SystemID: id, Timeline: tl, XLogPos: flushed}
	}
	for _, c := range []struct {
		name        string
		first, then pglogrepl.IdentifySystemResult
		mine, slot  pglogrepl.LSN
		want        pglogrepl.LSN
	}{
		{"ahead on the same server", sys("1", 1, 1000), sys("1", 1, 1000), 500, 300, 500},
		{"behind the slot", sys("1", 1, 1000), sys("1", 1, 1000), 200, 300, 300},
		{"another system", sys("1", 1, 1000), sys("2", 1, 1000), 500, 300, 300},
		{"a new timeline", sys("1", 1, 1000), sys("1", 2, 1000), 500, 300, 300},
		{"past the flushed WAL", sys("1", 1, 1000), sys("1", 1, 400), 500, 300, 300},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := &Stream{log: slog.New(slog.DiscardHandler)}
			// The first session learns the history; the slot is where
			// the process is.
			if got := s.resumeFrom(c.first, 0); got != 0 {
				t.Fatalf("first session from %s, want the slot's 0/0", got)
			}
			s.confirmed.Store(uint64(c.mine))
			if got := s.resumeFrom(c.then, c.slot); got != c.want {
				t.Fatalf("resumed from %s, want %s", got, c.want)
			}
		})
	}
}

// readUntil calls Next until ctx ends, and fails the test on any other
// error: the session must stay up. It may run on a goroutine of its own.
func readUntil(t *testing.T, ctx context.Context, sess *Session) {
	t.Helper()
	for {
		_, err := sess.Next(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			t.Errorf("the session ended: %v", err)
			return
		}
	}
}

// TestKeepaliveRequestsAreAnswered: a keepalive that asks for a reply is
// answered at once, not at the next status interval: with a status
// interval of 10 s and the server's wal_sender_timeout at 1 s (it asks
// after half of it, and ends the connection after all of it), the session
// stays up.
func TestKeepaliveRequestsAreAnswered(t *testing.T) {
	t.Parallel()
	pg := streamed(t, 1)
	cfg, err := pgx.ParseConfig(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["wal_sender_timeout"] = "1s"
	s, err := New(Config{ConnConfig: &cfg.Config, StatusInterval: 10 * time.Second, ReceiveTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := s.Open(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(errors.New("test over"))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	readUntil(t, ctx, sess)
}

// TestStatusUpdateTiming: an idle session reports to the server every
// status interval, and a confirmed position that moved is reported within
// about a tenth of it, not at the next interval.
func TestStatusUpdateTiming(t *testing.T) {
	t.Parallel()
	// walsender reads the replication view of the slot's walsender.
	walsender := func(t *testing.T, conn *pgx.Conn, col string) string {
		t.Helper()
		var v *string
		err := conn.QueryRow(t.Context(), `SELECT r.`+col+`::text FROM pg_stat_replication r
			JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = 'walrelay'`).Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) || v == nil {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		return *v
	}
	open := func(t *testing.T, interval time.Duration) (*pgtest.Server, *pgx.Conn, *Session) {
		pg := streamed(t, 1)
		s, err := New(Config{ConnString: pg.DSN, StatusInterval: interval, ReceiveTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		sess, err := s.Open(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sess.Close(errors.New("test over")) })
		conn := pgtest.Connect(t, pg.DSN)
		return pg, conn, sess
	}

	t.Run("idle, every interval", func(t *testing.T) {
		t.Parallel()
		_, conn, sess := open(t, 300*time.Millisecond)
		ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
		defer cancel()
		go readUntil(t, ctx, sess)
		replies := map[string]bool{}
		for ctx.Err() == nil {
			if v := walsender(t, conn, "reply_time"); v != "" {
				replies[v] = true
			}
			time.Sleep(20 * time.Millisecond)
		}
		// About 13 in 4 s; a session that reported only when asked, or
		// only when its position moved, would show one or two.
		if len(replies) < 5 {
			t.Fatalf("%d status updates seen in 4 s at a 300 ms interval", len(replies))
		}
	})

	t.Run("moved, within a tenth", func(t *testing.T) {
		t.Parallel()
		_, conn, sess := open(t, 10*time.Second)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var commitEnd pglogrepl.LSN
		for commitEnd == 0 {
			ch, err := sess.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if ch.Kind == Data && ch.Data[0] == 'C' {
				m, err := pglogrepl.Parse(ch.Data)
				if err != nil {
					t.Fatal(err)
				}
				commitEnd = m.(*pglogrepl.CommitMessage).TransactionEndLSN
			}
		}
		// The session's first status update went at its start: the next
		// one of the interval is due 10 s later.
		time.Sleep(500 * time.Millisecond)
		go readUntil(t, ctx, sess)
		start := time.Now()
		sess.Confirm(commitEnd)
		for walsender(t, conn, "flush_lsn") != commitEnd.String() {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("the confirmed position was not reported within 5 s at a 10 s interval")
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("reported after %s", time.Since(start).Round(time.Millisecond))
	})
}

// TestOpenUnlessTaken: OpenUnlessTaken returns at once, with the holder's
// pid, when another process streams the slot (where Open waits as a
// standby), and opens once this stream's own last session is closed: its
// walsender, which may still hold the slot a moment, is not another
// process.
func TestOpenUnlessTaken(t *testing.T) {
	t.Parallel()
	pg := streamed(t, 1)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	a, err := New(Config{ConnString: pg.DSN})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{ConnString: pg.DSN})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := a.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = b.OpenUnlessTaken(ctx)
	var active *SlotActiveError
	if !errors.As(err, &active) || uint32(active.PID) != a.lastPID {
		t.Fatalf("OpenUnlessTaken while another stream holds the slot: %v, want a SlotActiveError naming pid %d", err, a.lastPID)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("OpenUnlessTaken took %s to say the slot is taken", took)
	}
	sess.Close(errors.New("fenced"))
	again, err := a.OpenUnlessTaken(ctx)
	if err != nil {
		t.Fatalf("OpenUnlessTaken after the stream's own session closed: %v", err)
	}
	defer again.Close(errors.New("test over"))
	if _, err := b.OpenUnlessTaken(ctx); !errors.As(err, &active) {
		t.Fatalf("OpenUnlessTaken of the other stream: %v, want a SlotActiveError", err)
	}
}
