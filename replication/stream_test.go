package replication

import (
	"context"
	"errors"
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
