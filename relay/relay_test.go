package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/sink"
)

// ExampleRun embeds the relay in a program of its own: the outbox of
// public.outbox to the brokers, with a hook that counts what Kafka
// acknowledged.
func ExampleRun() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var published atomic.Int64
	err := relay.Run(ctx, relay.Config{
		ConnString: os.Getenv("DATABASE_URL"),
		CreateSlot: true,
		Outbox:     decoder.Config{Layout: decoder.Layout{Schema: "public", Table: "outbox"}},
		Sink:       sink.Config{Brokers: []string{"localhost:9092"}},
		Hooks: relay.Hooks{Acked: func(_, topic, deadLetter string, _ time.Time) {
			published.Add(1)
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published", published.Load())
}

// TestEmbedded runs the relay in-process through the package API against a
// throwaway PostgreSQL and kfake, connecting through a dialer of its own:
// every row arrives, the hooks see each, and cancelling the context stops it
// cleanly with everything confirmed.
func TestEmbedded(t *testing.T) {
	t.Parallel()
	pg, conn := outboxDB(t)
	kc := kafkatest.Start(t)
	// A parsed configuration with a dialer of the program's own: every
	// connection the relay opens, the replication session's too, goes
	// through it.
	connCfg, err := pgx.ParseConfig(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	var dials atomic.Int64
	dial := connCfg.DialFunc
	connCfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx, network, addr)
	}
	var acked, transactions atomic.Int64
	r, err := relay.New(relay.Config{
		ConnConfig: connCfg, CreateSlot: true,
		Sink: sink.Config{Brokers: kc.Addrs()},
		Hooks: relay.Hooks{
			Acked:       func(string, string, string, time.Time) { acked.Add(1) },
			Transaction: func() { transactions.Add(1) },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := runUntilStreaming(t, ctx, r)
	deadline := time.Now().Add(time.Minute)
	for i := range 10 {
		if _, err := conn.Exec(t.Context(), `INSERT INTO outbox VALUES (gen_random_uuid(), 'order', $1, 'Created', '{}')`, fmt.Sprint("o-", i)); err != nil {
			t.Fatal(err)
		}
	}
	for acked.Load() < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 10 events acknowledged", acked.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
	if transactions.Load() != 10 || r.InFlight() != 0 || r.ConfirmedLSN().String() == "0/0" {
		t.Fatalf("transactions %d, in flight %d, confirmed %s", transactions.Load(), r.InFlight(), r.ConfirmedLSN())
	}
	if dials.Load() < 2 { // the start-up checks, the replication session
		t.Fatalf("%d connections through the program's dialer", dials.Load())
	}
}

// TestErrorDuringTheDrainIsReturned: a stop that arrives inside a
// transaction reads on to its end; a row there that stops the stream (one of
// a table added to the publication meanwhile) is Run's error, not a clean
// stop.
func TestErrorDuringTheDrainIsReturned(t *testing.T) {
	t.Parallel()
	pg, conn := outboxDB(t, `CREATE TABLE notes (id int PRIMARY KEY)`)
	kc := kafkatest.Start(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var once atomic.Bool
	r, err := relay.New(relay.Config{
		ConnString: pg.DSN, CreateSlot: true, ShutdownTimeout: time.Minute,
		Sink: sink.Config{Brokers: kc.Addrs()},
		// The stop arrives with the transaction's first acknowledged event.
		Hooks: relay.Hooks{Acked: func(string, string, string, time.Time) {
			if once.CompareAndSwap(false, true) {
				cancel()
			}
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := runUntilStreaming(t, ctx, r)
	if _, err := conn.Exec(t.Context(), `ALTER PUBLICATION walrelay_outbox ADD TABLE notes`); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(t.Context(), conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(t.Context(), `INSERT INTO outbox SELECT gen_random_uuid(), 'order', 'o-' || g, 'Created', '{}' FROM generate_series(1, 20000) g`); err != nil {
			return err
		}
		_, err := tx.Exec(t.Context(), `INSERT INTO notes VALUES (1)`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, decoder.ErrUnexpectedRelation) {
			t.Fatalf("Run = %v, want the row of notes met during the drain", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("Run did not return")
	}
}

// fakePublisher is a Publisher of the test's own: it acknowledges every
// event at once, but fails the first publish of the event whose aggregate
// id is failOn (transient), and logs what happened in order.
type fakePublisher struct {
	failOn string
	mu     sync.Mutex
	failed bool
	broken bool // after the failure, until Abort: nothing is sent
	log    []string
}

func (f *fakePublisher) Ping(context.Context) error { return nil }
func (f *fakePublisher) Close()                     {}
func (f *fakePublisher) DataLosses() uint64         { return 0 }

func (f *fakePublisher) Abort(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.broken = false
	f.log = append(f.log, "abort")
	return nil
}

func (f *fakePublisher) Publish(_ context.Context, e *event.Event, done sink.Done) {
	f.mu.Lock()
	switch {
	case f.broken:
		f.mu.Unlock()
		done(sink.Delivery{Topic: "t"}, sink.ErrNotSent)
	case e.AggregateID == f.failOn && !f.failed:
		f.failed, f.broken = true, true
		f.log = append(f.log, "fail "+e.AggregateID)
		f.mu.Unlock()
		done(sink.Delivery{Topic: "t"}, errors.New("broker said no, this once"))
	default:
		f.log = append(f.log, e.AggregateID)
		f.mu.Unlock()
		done(sink.Delivery{Topic: "t"}, nil)
	}
}

// TestRestartResendsInOrder: a publish that fails transiently ends the
// session; the relay aborts the sink before the next session, which resends
// from the confirmed position: the failed event and every one after it
// reach the publisher again, in order, and nothing after the failure
// reaches it before the abort.
func TestRestartResendsInOrder(t *testing.T) {
	t.Parallel()
	pg, conn := outboxDB(t)
	f := &fakePublisher{failOn: "a-3"}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r, err := relay.New(relay.Config{ConnString: pg.DSN, CreateSlot: true, Publisher: f})
	if err != nil {
		t.Fatal(err)
	}
	done := runUntilStreaming(t, ctx, r)
	deadline := time.Now().Add(time.Minute)
	// One transaction of six rows: a-3 fails the first time.
	if _, err := conn.Exec(t.Context(), `INSERT INTO outbox SELECT gen_random_uuid(), 'order', 'a-' || g, 'Created', '{}' FROM generate_series(1, 6) g`); err != nil {
		t.Fatal(err)
	}
	want := "a-1,a-2,fail a-3,abort,a-1,a-2,a-3,a-4,a-5,a-6"
	for {
		f.mu.Lock()
		got := strings.Join(f.log, ",")
		f.mu.Unlock()
		if got == want {
			break
		}
		if time.Now().After(deadline) || len(got) > len(want) {
			t.Fatalf("the publisher saw %s, want %s", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// outboxDB starts a throwaway PostgreSQL with an outbox table (and the
// other statements given) and returns it with a connection.
func outboxDB(t *testing.T, more ...string) (*pgtest.Server, *pgx.Conn) {
	t.Helper()
	pg := pgtest.Start(t)
	conn := pgtest.Connect(t, pg.DSN)
	for _, sql := range append([]string{`CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL,
		type text NOT NULL, payload jsonb)`}, more...) {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	return pg, conn
}

// runUntilStreaming runs r until ctx ends, and returns once it streams
// with the channel Run's error arrives on.
func runUntilStreaming(t *testing.T, ctx context.Context, r *relay.Relay) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	deadline := time.Now().Add(time.Minute)
	for r.State() != "streaming" {
		if time.Now().After(deadline) {
			t.Fatalf("not streaming after a minute: %s", r.State())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return done
}
