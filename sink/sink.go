package sink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/backoff"
	"github.com/walrelay/walrelay/sink/produce"
	"github.com/walrelay/walrelay/sink/record"
	"github.com/walrelay/walrelay/sink/txn"
)

// ErrNotSent fails a record that was not sent because an earlier record
// failed, or because the sink was aborted or closed (produce.ErrNotSent).
var ErrNotSent = produce.ErrNotSent

// Sink produces events. Its methods are safe for concurrent use.
type Sink struct {
	cfg       Config
	cl        *kgo.Client    // the producer in at-least-once mode; nil in exactly-once mode (tx's)
	q         *produce.Queue // the next round (package produce)
	stop      func()         // ends the flusher's wait for a round
	flushed   chan struct{}  // closed when the flusher returns
	log       *slog.Logger
	records   *record.Builder          // what each event's record is (package record)
	stamps    stamps                   // the timestamps of records of events without a time
	counts    sync.Map                 // topic name -> its partition count (int32), for placed partitions
	topics    sync.Map                 // topic name -> topicInfo, learnt at its first event; at most maxCachedTopics
	topicsN   atomic.Int32             // entries of topics
	forgetMu  sync.Mutex               // held to learn a topic, and to forget and purge one (forgetATopic)
	forgotten map[string]*atomic.Int64 // under forgetMu: topics forgotten, not yet purged from the clients, and their records in flight
	refused   sync.Map                 // topic name -> the batch cap (int32) at which the broker refused a batch
	given     sync.Map                 // topic name -> the smallest batch cap (int32) a client was given (clientBatchCap), until the topic is purged from every client
	suspects  suspects                 // events failed by a refusal of their whole batch: send them alone
	brokerMax atomic.Int32             // the broker's message.max.bytes; 0 until Ping read it
	dataLoss  atomic.Uint64
	tx        *txn.Producer // the transactional producer; nil in at-least-once mode

	lanes      *produce.Lanes  // one client per broker, in at-least-once mode (produce.Lanes)
	partitions sync.Map        // topic name -> the highest partition count a lane's client saw (*atomic.Int32)
	fences     *produce.Fences // the connections to each broker, fenced ones closed
	tlsCfg     *tls.Config     // the dialer's TLS configuration, nil without TLS
	opts       []kgo.Opt       // cfg.Opts but their hooks (hooks.go)
	optHooks   []kgo.Hook      // the hooks of cfg.Opts: the producer's, relayed to the other clients
	waiting    atomic.Int64    // when the round in flight began (unix ns), 0 between rounds
}

// New checks cfg, fills its defaults and creates the client. It does not
// contact the brokers; Ping does.
func New(cfg Config) (*Sink, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	records, err := record.New(recordConfig(cfg))
	if err != nil {
		return nil, err
	}
	if err := cfg.bufferDefaults(); err != nil {
		return nil, err
	}
	codecOpt, err := compression(cfg.Compression)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "sink")
	s := &Sink{cfg: cfg, log: log, records: records}
	var partitioner kgo.Partitioner = kgo.StickyKeyPartitioner(nil) // murmur2, as the Java client
	if cfg.PlacedPartitions {
		partitioner = produce.PlacedPartitioner{ByKey: partitioner}
	}
	logs := newSlogAdapter(log)
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(partitioner),
		codecOpt,
		// The flusher sends rounds (package produce); the client sends nothing
		// on its own.
		kgo.ManualFlushing(),
		// Asked once per partition, after Publish learnt the topic.
		kgo.ProducerBatchMaxBytesFn(s.clientBatchCap),
		kgo.MaxBufferedRecords(cfg.MaxBufferedRecords),
		kgo.MaxBufferedBytes(cfg.MaxBufferedBytes),
		// A produce request holds about one batch, not one of each of
		// the broker's partitions (produce.RequestCap).
		kgo.BrokerMaxWriteBytes(produce.RequestCap(cfg.BatchMaxBytes)),
		// Retry sooner than the client's default (250ms doubling to 5s):
		// every retry holds the slot's position back.
		kgo.RetryBackoffFn(func(fails int) time.Duration { return backoff.Wait(50*time.Millisecond, time.Second, fails-1) }),
		kgo.WithLogger(logs), kgo.WithHooks(logs),
		kgo.ProduceRequestTimeout(cfg.RequestTimeout / 2),
		kgo.RequestTimeoutOverhead(cfg.RequestTimeout / 2),
		// A leader that went away is looked up again within half a second
		// (the client's default waits 5s between refreshes).
		kgo.MetadataMinAge(500 * time.Millisecond),
		// The broker answered OUT_OF_ORDER_SEQUENCE_NUMBER or
		// UNKNOWN_PRODUCER_ID: records it had acknowledged may be gone.
		// The client goes on with a new producer id; the sink fails what
		// is queued, so that the stream restarts from its confirmed
		// position.
		kgo.ProducerOnDataLossDetected(s.lostData),
	}
	if !cfg.DisableAutoCreateTopics {
		opts = append(opts, kgo.AllowAutoTopicCreation())
	}
	if cfg.Transactions != nil {
		tc := *cfg.Transactions // checked before any client is made; txn.New fills the defaults
		if err := tc.Defaults(); err != nil {
			return nil, err
		}
	}
	s.opts, s.optHooks = produce.SplitHooks(cfg.Opts)
	dial, tlsCfg, err := produce.WatchedDialer(s.opts)
	if err != nil {
		return nil, err
	}
	s.fences, s.tlsCfg = produce.NewFences(dial), tlsCfg
	core := slices.Clip(opts)
	base := append(core, s.opts...)
	// The dialer of cfg.Opts (TLS included), through the fences.
	dialer := []kgo.Opt{kgo.DialTLSConfig(nil), kgo.Dialer(s.fences.DialContext)}
	last := append(dialer, kgo.WithHooks(s.fences))
	s.q = newQueue(cfg)
	if cfg.Transactions != nil {
		// The transactional producer (package txn) makes its client, and
		// renews it after a fence.
		s.tx, err = txn.New(*cfg.Transactions, s.q, log, txn.Clients{Brokers: cfg.Brokers, ClientID: cfg.ClientID, Base: core, Opts: s.opts,
			Hooks: s.optHooks, ProducerOpts: cfg.ProducerOpts, Last: last, Side: s.clientOpts()})
	} else {
		opts = append(append(slices.Clip(base), kgo.WithHooks(s.optHooks...)), cfg.ProducerOpts...)
		s.cl, err = kgo.NewClient(append(opts, last...)...)
		if err != nil {
			err = fmt.Errorf("create kafka client: %w", err)
		}
	}
	if err != nil {
		return nil, err
	}
	if err := s.startRounds(base, dialer); err != nil {
		s.client().Close()
		return nil, err
	}
	return s, nil
}

// newQueue makes the queue of the rounds (package produce): in
// at-least-once mode the lanes hold half of the limits (produce.Lanes), the
// queue and the flusher's round a quarter each.
func newQueue(cfg Config) *produce.Queue {
	if cfg.Transactions == nil {
		cfg.MaxBufferedRecords, cfg.MaxBufferedBytes = max(cfg.MaxBufferedRecords/2, 1), max(cfg.MaxBufferedBytes/2, 1)
	}
	return produce.NewQueue(cfg.MaxBufferedRecords, cfg.MaxBufferedBytes, cfg.BatchMaxBytes)
}

// startRounds starts the flusher, which sends the queue's rounds through
// the lanes (made here, with base and dialer, the producer's hooks
// relayed) or, in exactly-once mode, through the transactional producer,
// and the watcher of the brokers.
func (s *Sink) startRounds(base, dialer []kgo.Opt) error {
	cfg := s.cfg
	s.flushed = make(chan struct{})
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	if s.tx == nil {
		// One client per broker (produce.Lanes): the producer's hooks through a
		// relay, records partitioned before they go to a lane.
		hooks, _ := s.cl.OptValue(kgo.WithHooks).([]kgo.Hook)
		laneOpts := append(slices.Clip(base), append(dialer,
			kgo.WithHooks(produce.HookRelay{Hooks: hooks}),
			kgo.RecordPartitioner(produce.PlacedPartitioner{ByKey: kgo.StickyKeyPartitioner(nil), Counts: &s.partitions}))...)
		var err error
		if s.lanes, err = produce.NewLanes(ctx, produce.LanesConfig{
			Opts: laneOpts, Seen: &s.partitions, Queue: s.q, Log: s.log, RequestTimeout: cfg.RequestTimeout,
			MaxRecords: cfg.MaxBufferedRecords / 2, MaxBytes: cfg.MaxBufferedBytes / 2, RoundCap: s.roundCapOf,
		}); err != nil {
			stop()
			return err
		}
	}
	// The flusher (produce.Flush) sends rounds through the lanes, or in
	// exactly-once mode through the transactional producer (txn.Rounds).
	var rounds produce.Sender = s.lanes
	if s.tx != nil {
		rounds = s.tx.Rounds(s.roundCapOf, &s.waiting)
	}
	go func() {
		defer close(s.flushed)
		produce.Flush(ctx, s.q, s.cfg.Linger, rounds)
	}()
	go s.watch(ctx)
	return nil
}

// client returns the producer: in exactly-once mode the transactional
// producer's, renewed after a fence.
func (s *Sink) client() *kgo.Client {
	if s.tx != nil {
		return s.tx.Client()
	}
	return s.cl
}

// Abort fails every record not yet sent and waits, within ctx, for those in
// flight to be answered; every callback has run when it returns nil, and
// the sink sends again. After a publish failure the caller calls it before
// it publishes the failed record again. A topic whose batch the broker
// refused as too large is then forgotten, so that its limit is read again
// before its next record. The caller publishes nothing while Abort runs:
// an event published then may be sent while an earlier one of its key
// fails.
func (s *Sink) Abort(ctx context.Context) error {
	abortBuffered := s.client().AbortBufferedRecords
	switch {
	case s.lanes != nil:
		abortBuffered = s.lanes.AbortBuffered
	case s.tx != nil:
		// The flusher ends the transaction at the barrier instead: the
		// client's transactional calls must not run concurrently.
		abortBuffered = nil
	}
	if err := s.q.Abort(ctx, abortBuffered); err != nil {
		return err
	}
	var stale []string
	s.refused.Range(func(k, _ any) bool {
		if _, ok := s.topics.LoadAndDelete(k); ok {
			s.topicsN.Add(-1)
			stale = append(stale, k.(string))
		}
		return true
	})
	if len(stale) > 0 {
		// The client asks ProducerBatchMaxBytesFn once per partition:
		// purging the topics makes it ask again.
		s.client().PurgeTopicsFromClient(stale...)
		if s.lanes != nil {
			s.lanes.Each(func(cl *kgo.Client) { cl.PurgeTopicsFromClient(stale...) })
		}
		for _, t := range stale {
			s.given.Delete(t)
		}
	}
	return nil
}

// Close closes the client; records not yet acknowledged are failed.
func (s *Sink) Close() {
	s.q.Close()
	s.stop()
	<-s.flushed
	if s.lanes != nil {
		s.lanes.Close()
	}
	if s.tx != nil {
		s.tx.Close()
		return
	}
	s.cl.Close()
}

// Delivery says where Kafka acknowledged an event.
type Delivery struct {
	Topic string
	// Partition is the record's partition, or -1 if it was never assigned
	// one (it failed before the client buffered it).
	Partition int32
	// DeadLetter is empty when the event went to its topic, else the reason
	// it went to the dead-letter topic (see HeaderReason).
	DeadLetter string
	// Skipped is true for an event that an earlier Kafka transaction
	// committed (exactly-once mode): it was not produced again.
	Skipped bool
	// Offset is the record's offset when Kafka acknowledged it, else 0.
	Offset int64
}

// Done is called once per published event, from the client's callback
// goroutine or the sink's (or, if Publish gives up waiting, from Publish); it
// must not block. A nil error means Kafka acknowledged the
// event on its topic or on the dead-letter topic, as d says.
type Done func(d Delivery, err error)

// Publish produces e and calls done with its fate. It blocks while the sink
// holds MaxBufferedRecords or MaxBufferedBytes; ctx bounds that wait and,
// once cancelled, fails the record if it is not yet sent when its round
// goes (a record already sent is answered). After a failure that fails the
// records behind it (anything but a dead-lettered event), every record
// published until Abort fails with ErrNotSent, unsent.
func (s *Sink) Publish(ctx context.Context, e *event.Event, done Done) {
	if s.cfg.Tracer != nil {
		e, done = s.traced(e, done)
	}
	gen := s.q.Generation()
	// The event's position: the position record of an exactly-once
	// transaction; the log of a topic that gained partitions (produce.Lanes).
	p := e.Position()
	pos := &p
	if s.tx != nil && s.tx.AlreadyCommitted(e) {
		done(Delivery{Topic: s.Topic(e), Partition: -1, Skipped: true}, nil)
		return
	}
	if e.Invalid != nil {
		why, topic := "invalid_event", ""
		if errors.Is(e.Invalid, event.ErrTooLarge) {
			// Read and dropped as it arrived: no payload to send, but its
			// routing was kept if its head held it (walrelay.topic then
			// names where it was going; else it is empty, not a guess).
			why = "too_large"
			if s.records.Routed(e) {
				topic = s.Topic(e)
			}
		}
		if errors.Is(e.Invalid, event.ErrBeforePrivileges) {
			why = ReasonMessageBeforePrivileges
		}
		s.deadLetter(ctx, e, why, topic, e.Invalid, gen, done)
		return
	}
	topic, template := s.records.Route(e)
	if s.tx != nil {
		// Refused by the broker in an earlier transaction, which it
		// doomed: this time it goes to the dead-letter topic, in a
		// transaction that can commit.
		if p, ok := s.tx.Poisons().Of(e); ok {
			s.deadLetter(ctx, e, p.Reason, topic, p.Cause, gen, done)
			return
		}
	}
	ti := s.topicInfoFor(ctx, topic)
	switch {
	case !ti.valid:
		s.deadLetter(ctx, e, "invalid_topic", topic, fmt.Errorf("topic %q from template %q is not a valid Kafka topic name", topic, template), gen, done)
		return
	case ti.forbidden != nil:
		s.deadLetter(ctx, e, ReasonForbiddenTopic, topic, fmt.Errorf("topic from template %q: %w", template, ti.forbidden), gen, done)
		return
	}
	r, err := s.records.Record(e, topic)
	if err != nil {
		s.deadLetter(ctx, e, "invalid_event", topic, err, gen, done)
		return
	}
	// Every record built counts toward the clock's next read (stamps), as
	// a dead letter's does, whether or not its event has a time of its own.
	if stamp := s.stamps.of(e); r.Timestamp.IsZero() {
		r.Timestamp = stamp
	}
	if e.HasPartition && s.cfg.PlacedPartitions {
		if n := s.partitionCount(ctx, topic, e.Partition); n > 0 && e.Partition >= n {
			s.deadLetter(ctx, e, "invalid_partition", topic, fmt.Errorf("partition %d from the row's partition column: topic %s has %d partitions", e.Partition, topic, n), gen, done)
			return
		}
		r.Partition = e.Partition
	}
	if s.cfg.KeyFormat == record.FormatAvro || s.cfg.ValueFormat.Registry() {
		// Before the JSON formats: they never fail, and a key or value
		// written here is not written again.
		if !s.registryEncode(ctx, e, r, topic, gen, done) {
			return
		}
	}
	if s.cfg.ValueFormat == record.FormatRegistryPassthrough && !s.passthrough(ctx, e, r, topic, gen, done) {
		return
	}
	expandCap := 0 // the cap an expanded value must fit, read only to expand
	if s.cfg.ExpandJSONPayload {
		expandCap = int(s.batchCapOf(topic))
	}
	if err := s.records.Encode(e, r, expandCap); errors.Is(err, record.ErrExpandedTooLarge) {
		s.deadLetter(ctx, e, "too_large", topic, fmt.Errorf("%w: %w", kerr.MessageTooLarge, err), gen, done)
		return
	} else if err != nil {
		s.deadLetter(ctx, e, ReasonFormat, topic, err, gen, done)
		return
	}
	// An event whose batch the broker refused goes in a request of its own,
	// so that the broker's answer is about it alone.
	alone := s.suspects.has(suspectOf(e))
	if s.tx != nil {
		// A record the client refuses as too large would doom its whole
		// transaction: it goes to the dead-letter topic instead, in it.
		if size, over := s.overCap(r); over {
			s.deadLetter(ctx, e, "too_large", topic, fmt.Errorf("%w: the record (%d bytes with its framing) is over the topic's batch cap %d", kerr.MessageTooLarge, size, s.batchCapOf(topic)), gen, done)
			return
		}
	}
	inflight, ok := s.holdTopic(topic, ti)
	for !ok { // forgotten meanwhile (forgetATopic): learnt again after its purge
		inflight, ok = s.holdTopic(topic, s.topicInfoFor(ctx, topic))
	}
	s.q.Push(ctx, r, alone, pos, gen, s.answer(ctx, e, topic, alone, inflight, gen, done))
}

// answer returns the callback of e's record to topic, which calls done
// with its fate: acknowledged; the batch refused (transient: the event is
// sent again, alone if any record of the batch may be the cause); refused
// for itself (dead-lettered, or in exactly-once mode poisoned and sent
// again); else failed, breaking the round. inflight is the topic's count
// of records in flight (holdTopic), nil if not kept.
func (s *Sink) answer(ctx context.Context, e *event.Event, topic string, alone bool, inflight *atomic.Int64, gen uint64, done Done) func(*kgo.Record, error) {
	return func(r *kgo.Record, err error) {
		if inflight != nil {
			inflight.Add(-1)
		}
		switch {
		case errors.Is(err, produce.ErrStale):
			done(Delivery{Topic: topic, Partition: -1}, err)
		case err == nil:
			if alone {
				s.suspects.clear(suspectOf(e))
			}
			done(Delivery{Topic: topic, Partition: r.Partition, Offset: r.Offset}, nil)
		case s.refusedBatch(r, err):
			s.q.BreakOn(err)
			// Transient: the stream restarts, Abort forgets the topic, and
			// the resent records go in batches under the limit read again.
			if _, loaded := s.refused.LoadOrStore(topic, s.batchCapOf(topic)); !loaded {
				s.log.Warn("the broker refused a batch as too large: the topic's max.message.bytes must be below the cap walrelay read; reading it again", "topic", topic, "err", err)
			}
			done(Delivery{Topic: topic, Partition: r.Partition}, failure.Mark(failure.Retriable, fmt.Errorf("publish event %s to %s: the broker refused its batch: %w", e.ID, topic, err)))
		case refusesBatch(err) && !alone:
			// The broker refused the batch for one record of it, or the
			// client failed the partition's records behind it: which one is
			// unknown. Transient: once the stream restarts, this event goes
			// alone, and only a record refused alone is dead-lettered.
			s.q.BreakOn(err)
			s.suspects.add(suspectOf(e))
			done(Delivery{Topic: topic, Partition: r.Partition}, failure.Mark(failure.Retriable, fmt.Errorf("publish event %s to %s: the broker refused its batch (sent again alone): %w", e.ID, topic, err)))
		case kindOf(err) == failure.PerEvent && s.tx != nil:
			// The refusal dooms the transaction, and every other event of
			// it: the stream restarts, and this event, published again,
			// goes to the dead-letter topic instead (txn.Poisons).
			s.suspects.clear(suspectOf(e))
			s.tx.Poisons().Add(e, reason(err), err, false)
			s.q.BreakOn(err)
			done(Delivery{Topic: topic, Partition: r.Partition}, failure.Mark(failure.Retriable, fmt.Errorf("publish event %s to %s: the broker refused it (dead-lettered when sent again): %w", e.ID, topic, err)))
		case kindOf(err) == failure.PerEvent:
			s.suspects.clear(suspectOf(e))
			// The promise must not block on the client: dead-letter from a
			// goroutine of its own. This is the rare path. After an Abort
			// the dead letter is refused (gen): the event is resent.
			go s.deadLetter(ctx, e, reason(err), topic, err, gen, done)
		default:
			s.q.BreakOn(err)
			done(Delivery{Topic: topic, Partition: r.Partition}, failure.Mark(kindOf(err), fmt.Errorf("publish event %s to %s: %w", e.ID, topic, err)))
		}
	}
}
