package txn

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/sink/produce"
)

// Exactly-once production (package sink's Config.Transactions).
//
// Records go to Kafka in transactions. The flusher opens one with the first
// record of a round, and commits it at a round's end once it is Interval old
// (up to ten times that while a full round waits behind it: a catch-up) or
// holds MaxRecords events; with the events, the transaction holds a
// record of the last event's position (event.Position) on the offsets topic,
// keyed by Key. An event's Done runs only when its transaction committed, so
// the caller confirms nothing that Kafka could still abort. Until then the
// transaction's records count against the buffers (MaxBufferedRecords and
// MaxBufferedBytes) with the queued ones: Publish waits while the open
// transaction and the queue hold that many, and the transaction then
// commits at once, with what is queued, to make room (nothing more can
// join it: produce.Queue.heldFull). A catch-up's transactions are so bounded by
// the buffers, not by MaxRecords alone: with the default buffers they
// hold at most MaxBufferedRecords (5,000) events, under MaxRecords'
// default. If any record of
// a transaction fails, or the commit does, the transaction is aborted, the
// sink is broken as in at-least-once mode, and every event of the
// transaction is answered with an error; the caller resends from its
// confirmed position, and Publish answers at once, without producing, every
// event at or before the committed position: Kafka has it already.
//
// At start (Resume, once the replication session holds the slot) the
// transactional producer is initialised first, which
// fences an earlier instance of the same transactional id and aborts its
// open transaction; then the committed position is read with read_committed
// isolation up to a marker that a transaction of this instance wrote, so
// that nothing committed before it is missed. A commit whose outcome is
// unknown is resolved the same way after the abort; while the broker is
// away the sink stays broken (a retriable failure) and the next Resume
// tries again, so an outage needs no restart of the process.
//
// A fence (the broker refused the producer: PRODUCER_FENCED,
// INVALID_PRODUCER_EPOCH) fails the transaction's events fatally with
// ErrFenced, and the client can do nothing more. The caller decides by the
// slot: if another process streams it, another instance took over and the
// caller stops; if its next session holds the slot, the broker's answer was
// not another instance's doing (it follows a commit whose answer was lost),
// and Resume makes a new producer of the id (renewClient), which fences any
// other, and reads the committed position again.

// readIdleTimeout bounds how long a read of the offsets topic to its
// marker may go without a record: a large topic takes long but makes
// progress; a reader that stalls (seen on a loaded machine) or an open
// transaction of another instance that holds the topic's last stable
// offset fails the read, retriable, and the next attempt makes a new
// reader.
const readIdleTimeout = 15 * time.Second

// txnStepTimeout bounds each step of Resume that waits on the brokers
// (initialising the producer id, writing the marker): one that does not
// finish fails, retriable, and the relay tries the session again, rather
// than waiting without end.
const txnStepTimeout = 30 * time.Second

// ErrFenced stops a relay whose transactional id another instance took.
// The broker says the same (INVALID_PRODUCER_EPOCH) of a transaction it
// aborted because it outlived the transaction timeout, during an outage
// longer than that: the message names both.
var ErrFenced = errors.New("another walrelay instance took over the transactional id (fenced)")

// ErrTransactionTimedOut stops a relay whose open transaction the broker
// aborted because it outlived the transaction timeout: Kafka took longer
// than that to accept it (an outage). The broker's answer is the one a
// fence gets (INVALID_PRODUCER_EPOCH or PRODUCER_FENCED); the age of the
// transaction tells them apart. Nothing of the transaction is committed;
// a restart resumes from the committed position.
var ErrTransactionTimedOut = errors.New("the broker aborted the kafka transaction: it was open longer than the transaction timeout")

// ErrWALHistory stops a relay whose committed position is not on the
// database's WAL history (checkHistory).
var ErrWALHistory = errors.New("the committed position is not on this database's WAL history")

// ErrOtherTransactionalID stops a relay whose slot's committed position
// was written under another transactional id than its own (and not the
// one kafka.transactional_id_takeover names).
var ErrOtherTransactionalID = errors.New("the committed position belongs to another transactional id")

// ErrSharedTransactionalID stops a relay whose transactional id another
// walrelay instance, of another slot, uses too: each would fence the
// other without end (kafka.transactional_id must be unique per slot).
var ErrSharedTransactionalID = errors.New("another walrelay instance, of another slot, uses the same transactional id: each is fenced by the other (kafka.transactional_id must be unique per slot)")

// ErrFencedTooOften stops a relay whose producer was refused as fenced
// more often than mayRenew allows, though it held its slot each time, no
// lost answer of the broker explained it, and the offsets topic showed no
// other instance of the slot (nor of another slot) under the id: either
// the slot changes hands between instances of it too often, or a slot
// with an offsets topic of its own shares the transactional id.
var ErrFencedTooOften = errors.New("the producer was refused as fenced too often, with no lost answer and no other instance seen on the offsets topic")

// ErrOffsetsTopicNotReady is the offsets topic not ready at a start: its
// creation refused as a cluster short of brokers refuses it
// (INVALID_REPLICATION_FACTOR while a broker restarts), or the topic not
// in the metadata yet after its creation. A start waits for it, as for
// brokers that do not answer, and says why.
var ErrOffsetsTopicNotReady = errors.New("the offsets topic is not ready")

// Producer is the transactional producer of exactly-once mode: its
// client, renewed after a fence, and its transactions (see the package
// doc). Rounds drives it on the flusher; Resume runs on the caller's
// goroutine between sessions. Its other methods are safe for concurrent
// use.
type Producer struct {
	cfg      Config
	log      *slog.Logger
	q        *produce.Queue             // the sink's queue: a failure breaks it
	cl       atomic.Pointer[kgo.Client] // the client; replaced only by renewClient (resume.go)
	opts     []kgo.Opt                  // the client's options, for renewClient
	hooks    []kgo.Hook                 // the hooks given for the producer, told of its creation and close by the producer (announce)
	brokers  []string                   // the seed brokers, for the offsets reader and the fencer
	clientID string                     // the sink's client id, which theirs extend
	side     []kgo.Opt                  // the options of the offsets reader and the fencer (Clients.Side)

	mu        sync.Mutex
	committed event.Position // every event at or before it is in Kafka
	writer    string         // the transactional id that committed it, as read at start
	onTL      int32          // the timeline it was committed on (0: not recorded)
	timeline  int32          // the timeline of the session: that of the positions committed now
	readLast  int64          // the records of the offsets topic the last readCommitted read
	foreign   string         // the system identifier and database of a position taken over from another one (logged once)
	failed    error          // the first failure of a record of the open transaction
	held      []heldDone     // the open transaction's answers, given when it ends

	started bool // Resume initialised the producer; only the caller's goroutine reads it
	// fencedBy is the fence (wrapping ErrFenced) that the broker answered
	// the last transaction with, or Resume's first-session path
	// (fencedAtStart): the client can do nothing more, and the next Resume
	// renews it (renewClient). Guarded by mu.
	fencedBy error
	renewals int // clients renewed after a fence, by Resume; guarded by mu
	// endUnknown: the last end of a transaction (a commit or an abort,
	// of events or of readCommitted's marker) was answered with neither
	// success nor a fence: it may have landed, and the broker then answers
	// the re-initialisation of the producer that follows as fenced (its
	// epoch moved on) though no other producer of the id ran. A renewal
	// after it is explained (mayRenew); a commit that succeeds clears it
	// (endAnswered). Guarded by mu.
	endUnknown bool
	// unexplained are the times of the renewals of the last LongWindow
	// that neither a lost answer nor another instance of the slot
	// explained (mayRenew). Guarded by mu.
	unexplained []time.Time
	// pending is how many of unexplained's last renewals wait for the
	// read of the committed position that follows them: if it finds a
	// record of this slot that this sink did not write (sameSlot), they
	// are explained and dropped (readCommitted, which runs on the
	// flusher too, after a commit of unknown outcome). Guarded by mu.
	pending int
	// ownAt is the offset of this sink's latest record on the offsets
	// topic, a marker or a position (-1 before any): a record of the slot
	// past it is another instance's (sameSlot). Guarded by mu.
	ownAt int64
	// firstMarker is the offset of the first marker this sink committed
	// to the offsets topic (-1 before it): a record past it (a position,
	// another marker) was written while this sink ran (sharedBy). Guarded
	// by mu.
	firstMarker int64
	// unresolved: a commit's outcome is not known yet (the broker went
	// away before it could be read back); Resume reads it before anything
	// more is produced.
	unresolved bool

	// poisoned are the events that the broker refused on their own in a
	// transaction, which that refusal doomed; published again, each goes
	// to the dead-letter topic instead, so the next transaction commits.
	poisoned Poisons

	// The flusher's own.
	cur     Current // the open transaction
	commits uint64
}

type heldDone struct {
	done func(*kgo.Record, error)
	r    *kgo.Record
	err  error
}

// Clients are the options of the clients the producer makes, as package
// sink gives them.
type Clients struct {
	// Brokers and ClientID are the sink's seed brokers and client id.
	Brokers  []string
	ClientID string
	// Base are the options the producer shares with the sink's other
	// producing clients, without hooks and without the sink's client
	// options (Opts), which come after the producer's transactional id and
	// timeout, so that they may set those too: applied last, as
	// sink.Config.Opts says.
	Base []kgo.Opt
	Opts []kgo.Opt
	// Hooks are the hooks given in the sink's client options, and
	// ProducerOpts the options of the producer alone (hooks among them):
	// the producer's hooks see its events through a relay, and its
	// creation and close once, from the producer (announce).
	Hooks        []kgo.Hook
	ProducerOpts []kgo.Opt
	// Last are applied last: the dialer and its hooks.
	Last []kgo.Opt
	// Side are the options of the offsets reader and the fencer, applied
	// after their own: the sink's client options, their hooks through a
	// relay.
	Side []kgo.Opt
}

// New fills cfg's defaults and makes the transactional producer of
// cfg.ID, whose failures break q; log is the sink's. It does not contact
// the brokers: Resume initialises the producer.
func New(cfg Config, q *produce.Queue, log *slog.Logger, c Clients) (*Producer, error) {
	if err := cfg.Defaults(); err != nil {
		return nil, err
	}
	p := &Producer{cfg: cfg, log: log, q: q, firstMarker: -1, ownAt: -1, brokers: c.Brokers, clientID: c.ClientID, side: c.Side}
	// The producer may be renewed (renewClient): the hooks see its events
	// through a relay, and its creation and its close once, from the
	// producer (announce), so that a hook that registers metrics when it
	// sees a client created (kprom) keeps them across a renewal and is not
	// written to while the old producer's hook goroutines may still read
	// it.
	producerOpts, own := produce.SplitHooks(c.ProducerOpts)
	p.hooks = append(slices.Clip(c.Hooks), own...)
	opts := append(slices.Clip(c.Base), kgo.TransactionalID(cfg.ID), kgo.TransactionTimeout(cfg.Timeout))
	opts = append(opts, c.Opts...)
	opts = append(opts, kgo.WithHooks(produce.HookRelay{Hooks: p.hooks}))
	opts = append(opts, producerOpts...)
	opts = append(opts, c.Last...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	p.cl.Store(cl)
	p.opts = opts
	p.announce(cl, true)
	return p, nil
}

// Client returns the producer's client (a new one after a renewal).
func (p *Producer) Client() *kgo.Client { return p.cl.Load() }

// Close closes the client; records not yet answered are failed.
func (p *Producer) Close() {
	cl := p.Client()
	cl.Close()
	p.announce(cl, false)
}

// announce tells the hooks given for the producer that its client was
// created (created) or closed, as a client itself tells them outside
// exactly-once mode.
func (p *Producer) announce(cl *kgo.Client, created bool) {
	for _, h := range p.hooks {
		if n, ok := h.(kgo.HookNewClient); ok && created {
			n.OnNewClient(cl)
		}
		if c, ok := h.(kgo.HookClientClosed); ok && !created {
			c.OnClientClosed(cl)
		}
	}
}

// Committed returns the position up to which every event is in Kafka
// (the zero position before any).
func (p *Producer) Committed() event.Position {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.committed
}

// Poisons are the events that go to the dead-letter topic when they are
// published again (Poisons): package sink notes them when the broker
// refuses one, and forgets them when their dead letter is committed.
func (p *Producer) Poisons() *Poisons { return &p.poisoned }

// Counts are what a Producer did so far, for tests and diagnostics.
type Counts struct {
	Commits     uint64 // transactions committed
	Renewals    int    // clients renewed after a fence
	Unexplained int    // renewals of the last hour that nothing explained (mayRenew)
	ReadLast    int64  // the records of the offsets topic the last read of the committed position read
}

// Counts returns what the producer did so far.
func (p *Producer) Counts() Counts {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Counts{Commits: p.commits, Renewals: p.renewals, Unexplained: len(p.unexplained), ReadLast: p.readLast}
}

// Began returns when the open (or last) transaction began. It is the
// flusher's: call it from Config.OnCommit or OnAbort.
func (p *Producer) Began() time.Time { return p.cur.Began() }

// AlreadyCommitted reports whether e is at or before the committed
// position.
func (p *Producer) AlreadyCommitted(e *event.Event) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !e.Position().After(p.committed)
}
