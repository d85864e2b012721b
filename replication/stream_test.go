package replication

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/internal/pgtest"
)

// streamed gives a test a server with an outbox, its publication and slot,
// and one committed transaction of rows rows after the slot.
func streamed(t *testing.T, rows int) *pgtest.Server {
	t.Helper()
	pg := pgtest.Start(t)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE TABLE outbox (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsurePublication(ctx, conn, Outbox{Publication: "walrelay_outbox", Schema: "public", Table: "outbox"}); err != nil {
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

// TestFatalErrorDuringTheDrainIsReturned: a stop that arrives inside a
// transaction reads on to its end; a Handler error then (a message that
// does not decode) is the stream's error, not a clean stop.
func TestFatalErrorDuringTheDrainIsReturned(t *testing.T) {
	t.Parallel()
	pg := streamed(t, 10)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	broken := errors.New("message does not decode")
	var handled atomic.Int32
	s, err := New(Config{
		ConnString: pg.DSN,
		Handle: func(ctx context.Context, _ pglogrepl.LSN, _ []byte) error {
			if handled.Add(1) == 1 {
				cancel() // the stop arrives inside the transaction
				return nil
			}
			if ctx.Err() != nil {
				return broken
			}
			return nil
		},
		SafePosition:        func() pglogrepl.LSN { return 0 },
		BetweenTransactions: func() bool { return false },
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, broken) {
			t.Fatalf("Run = %v, want the Handler's error from the drain", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return")
	}
}

// TestReceiveTimeoutMustAllowStatusIntervals: a receive timeout that leaves
// the server less than four status intervals to answer a reply request is
// refused.
func TestReceiveTimeoutMustAllowStatusIntervals(t *testing.T) {
	t.Parallel()
	_, err := New(Config{ConnString: "postgres://x@localhost/db", Handle: func(context.Context, pglogrepl.LSN, []byte) error { return nil },
		SafePosition: func() pglogrepl.LSN { return 0 }, StatusInterval: time.Second, ReceiveTimeout: 2 * time.Second})
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
			var mine pglogrepl.LSN
			s := &Stream{cfg: Config{SafePosition: func() pglogrepl.LSN { return mine }}, log: slog.New(slog.DiscardHandler)}
			// The first session learns the history; the slot is where
			// the process is.
			if got := s.resumeFrom(c.first, 0); got != 0 {
				t.Fatalf("first session from %s, want the slot's 0/0", got)
			}
			mine = c.mine
			if got := s.resumeFrom(c.then, c.slot); got != c.want {
				t.Fatalf("resumed from %s, want %s", got, c.want)
			}
		})
	}
}
