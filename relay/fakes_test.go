package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/walrelay/walrelay/checkpoint"
	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/testkit/pgoutputtest"
	"github.com/walrelay/walrelay/replication"
	"github.com/walrelay/walrelay/sink"
)

// The loop's tests run the relay against a source and a publisher of the
// test's own: a WAL of scripted transactions that each session streams from
// the confirmed position, as the server does, and a publisher that answers
// each event as the test says. No server and no broker: what is tested is
// the relay's sequencing (restart, drain, confirmation).

// outboxOID is the scripted outbox's relation id.
const outboxOID = 16384

// walTxn is a transaction of the scripted WAL: its events, in order.
type walTxn struct{ ids []string }

// eventID is the event id of name: the decoder wants a UUID.
func eventID(name string) string {
	var n int
	fmt.Sscanf(strings.TrimPrefix(name, "e"), "%d", &n)
	return fmt.Sprintf("00000000-0000-4000-8000-%012d", n)
}

func nameOf(id string) string {
	var n int
	fmt.Sscanf(id[len(id)-12:], "%d", &n)
	return fmt.Sprintf("e%d", n)
}

// Positions of transaction k: its rows from base(k), its commit at
// base(k)+0x800, its end at base(k)+0x900.
func base(k int) pglogrepl.LSN { return pglogrepl.LSN(0x1000 * (k + 1)) }

func commitLSN(k int) pglogrepl.LSN { return base(k) + 0x800 }

func endLSN(k int) pglogrepl.LSN { return base(k) + 0x900 }

func keepaliveLSN(n int) pglogrepl.LSN { return base(n) } // past the last transaction

// fakeSource streams wal: each session from the slot's confirmed position
// (the highest any session confirmed), a Relation message first, then every
// transaction that ends after it, then a keepalive, then nothing.
type fakeSource struct {
	wal []walTxn
	// pauseAt, per session in order, is the index of the change before
	// which Next waits for its context to end (once); -1 or absent: none.
	pauseAt []int

	mu        sync.Mutex
	confirmed pglogrepl.LSN
	sessions  []*fakeSession
	opened    chan *fakeSession
}

func newFakeSource(wal ...walTxn) *fakeSource {
	return &fakeSource{wal: wal, opened: make(chan *fakeSession, 100)}
}

func (s *fakeSource) Open(ctx context.Context) (session, error) {
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := &fakeSession{src: s, from: s.confirmed, pauseAt: -1, closed: make(chan struct{})}
	if n := len(s.sessions); n < len(s.pauseAt) {
		ss.pauseAt = s.pauseAt[n]
	}
	cols := []pgoutputtest.Col{{Name: "id", OID: pgtype.UUIDOID}, {Name: "aggregatetype", OID: pgtype.VarcharOID},
		{Name: "aggregateid", OID: pgtype.VarcharOID}, {Name: "type", OID: pgtype.VarcharOID}, {Name: "payload", OID: pgtype.JSONBOID}}
	ss.changes = append(ss.changes, data(base(0), pgoutputtest.Relation(outboxOID, "public", "outbox", cols)))
	for k, txn := range s.wal {
		if endLSN(k) <= ss.from {
			continue
		}
		ss.changes = append(ss.changes, data(base(k), pgoutputtest.Begin(commitLSN(k), time.Now(), uint32(100+k))))
		for j, name := range txn.ids {
			str := func(v string) *string { return &v }
			ss.changes = append(ss.changes, data(base(k)+pglogrepl.LSN(0x10*(j+1)),
				pgoutputtest.Insert(outboxOID, str(eventID(name)), str("order"), str("agg-"+name), str("Created"), str(`{}`))))
		}
		ss.changes = append(ss.changes, data(commitLSN(k), pgoutputtest.Commit(commitLSN(k), endLSN(k), time.Now())))
	}
	ss.changes = append(ss.changes, replication.Change{Kind: replication.Keepalive, WALEnd: keepaliveLSN(len(s.wal))})
	s.sessions = append(s.sessions, ss)
	s.opened <- ss
	return ss, nil
}

func data(at pglogrepl.LSN, msg []byte) replication.Change {
	return replication.Change{Kind: replication.Data, WALStart: at, Data: msg}
}

func (s *fakeSource) State() string { return "streaming" }

func (s *fakeSource) ReceivedLSN() pglogrepl.LSN { return 0 }

func (s *fakeSource) Reconnects() uint64 { return 0 }

func (s *fakeSource) slotConfirmed() pglogrepl.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.confirmed
}

func (s *fakeSource) opens() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

type fakeSession struct {
	src     *fakeSource
	from    pglogrepl.LSN
	changes []replication.Change
	pauseAt int
	next    atomic.Int64 // the index of the next change

	mu     sync.Mutex
	isDone bool
	reason error
	closed chan struct{}
}

func (ss *fakeSession) From() pglogrepl.LSN { return ss.from }

func (ss *fakeSession) History() event.WALHistory {
	return event.WALHistory{SystemID: "fake", Timeline: 1, Flushed: keepaliveLSN(len(ss.src.wal))}
}

func (ss *fakeSession) Next(ctx context.Context) (replication.Change, error) {
	i := int(ss.next.Load())
	if i == ss.pauseAt || i == len(ss.changes) {
		if i == ss.pauseAt {
			ss.pauseAt = -1
		}
		<-ctx.Done()
		return replication.Change{}, ctx.Err()
	}
	ss.next.Add(1)
	return ss.changes[i], nil
}

func (ss *fakeSession) Confirm(lsn pglogrepl.LSN) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.isDone {
		return
	}
	ss.src.mu.Lock()
	ss.src.confirmed = max(ss.src.confirmed, lsn)
	ss.src.mu.Unlock()
}

func (ss *fakeSession) Close(reason error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if !ss.isDone {
		ss.isDone, ss.reason = true, reason
		close(ss.closed)
	}
}

// closedWith waits for the session to close and returns why.
func (ss *fakeSession) closedWith(t *testing.T) error {
	t.Helper()
	select {
	case <-ss.closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the session was not closed")
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.reason
}

// scriptedPublisher answers each event at once with success, unless
// answers says otherwise for the event's nth publish (counted from 1):
// an error, or hold (the answer waits until the test gives it).
type scriptedPublisher struct {
	answers map[string]func(n int) (err error, hold bool)

	mu     sync.Mutex
	log    []string // each publish's event name, "abort"
	count  map[string]int
	broken bool // after a failure, until Abort: nothing is sent
	held   map[string]sink.Done
}

var errRefused = errors.New("broker said no")

func (f *scriptedPublisher) Ping(context.Context) error { return nil }

func (f *scriptedPublisher) Close() {}

func (f *scriptedPublisher) DataLosses() uint64 { return 0 }

func (f *scriptedPublisher) Abort(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.broken = false
	f.log = append(f.log, "abort")
	return nil
}

func (f *scriptedPublisher) Publish(_ context.Context, e *event.Event, done sink.Done) {
	name := nameOf(e.ID)
	f.mu.Lock()
	if f.count == nil {
		f.count, f.held = map[string]int{}, map[string]sink.Done{}
	}
	f.count[name]++
	f.log = append(f.log, name)
	var err error
	var hold bool
	if a := f.answers[name]; a != nil {
		err, hold = a(f.count[name])
	}
	switch {
	case f.broken:
		f.mu.Unlock()
		done(sink.Delivery{Topic: "t"}, sink.ErrNotSent)
	case hold:
		f.held[name] = done
		f.mu.Unlock()
	case err != nil:
		f.broken = true
		f.mu.Unlock()
		done(sink.Delivery{Topic: "t"}, err)
	default:
		f.mu.Unlock()
		done(sink.Delivery{Topic: "t"}, nil)
	}
}

// answer gives the held answer of name.
func (f *scriptedPublisher) answer(t *testing.T, name string, err error) {
	t.Helper()
	f.mu.Lock()
	done := f.held[name]
	delete(f.held, name)
	f.mu.Unlock()
	if done == nil {
		t.Fatalf("%s is not held", name)
	}
	done(sink.Delivery{Topic: "t"}, err)
}

func (f *scriptedPublisher) published() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.log, ",")
}

// waitPublished waits until the publisher saw want (comma-separated), and
// fails if it saw more or something else.
func (f *scriptedPublisher) waitPublished(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := f.published()
		if got == want {
			return
		}
		if !strings.HasPrefix(want, got) || time.Now().After(deadline) {
			t.Fatalf("the publisher saw %s, want %s", got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func held(n int) (error, bool) { return nil, n == 1 }

// loopRelay is a relay of src and pub, its pipeline as Run sets it up
// after the start-up checks.
func loopRelay(t *testing.T, src source, pub Publisher) *Relay {
	t.Helper()
	dec, err := decoder.New(decoder.Config{Layout: decoder.Layout{RelationID: outboxOID}}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{ShutdownTimeout: 10 * time.Second}
	cfg.Hooks.defaults()
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	r := &Relay{cfg: cfg, log: log, sink: pub, src: src}
	r.p = &pipeline{dec: dec, sink: pub, tr: checkpoint.New(0), log: log, hooks: cfg.Hooks}
	return r
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// pumpRelay runs r's loop as Run does until ctx ends, and returns its
// result on the channel.
func pumpRelay(ctx context.Context, r *Relay) <-chan error {
	runCtx, stop := context.WithCancel(ctx)
	r.p.stop = stop
	errc := make(chan error, 1)
	go func() { errc <- r.pump(runCtx) }()
	return errc
}

func result(t *testing.T, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not stop")
		return nil
	}
}
