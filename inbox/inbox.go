package inbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/walrelay/walrelay/migrations"
)

// Config configures a Consumer. Postgres, Brokers, Topics and Group are
// required; zero values of the others mean the defaults.
type Config struct {
	// Postgres is the pool of the consumer's own database, which holds the
	// inbox table and whatever the handler writes.
	Postgres *pgxpool.Pool
	// Brokers are the Kafka seed brokers.
	Brokers []string
	// Topics are the topics consumed.
	Topics []string
	// Group is the Kafka consumer group.
	Group string
	// Consumer names this consumer in the inbox table. Default Group. Two
	// services with different names each handle every event once.
	Consumer string
	// Schema and Table name the inbox table. Default public.walrelay_inbox.
	Schema, Table string
	// MaxAttempts is how many times a record's handler fails before the
	// record is dead-lettered. Default 5. Errors of the database
	// connection itself are retried without limit and not counted, unless
	// the connection broke after the record's handler ran in it, the
	// database still answers and did not restart, and the handler is to
	// blame: the server ended the session on
	// idle_in_transaction_session_timeout or transaction_timeout, or the
	// handler ran (the transaction lasted) at least that long. That, and a
	// transaction that fails after its handlers ran for a reason not the
	// connection's (a deferred constraint at the commit), counts as the
	// failure of the handler that caused it; the others of its batch are
	// not counted. A session ended for no reason that can be seen (an
	// operator's pg_terminate_backend, a proxy; a handler ending its own
	// backend looks the same) is not counted, up to 10 times in a row,
	// then the record is dead-lettered.
	MaxAttempts int
	// RetryBackoffMin and RetryBackoffMax bound the wait before a retry
	// (capped exponential, with jitter). Default 100ms and 10s.
	RetryBackoffMin, RetryBackoffMax time.Duration
	// DeadLetterTopic receives the records that failed MaxAttempts times,
	// those whose event id cannot be read: no "id" header (reason
	// no_id), an empty one (empty_id) or several (several_ids), and those
	// whose handler returned ErrUndecodable (undecodable, at once: a
	// value that Registry.Decode cannot decode). A handler returning
	// ErrRegistryUnavailable has its record retried without limit, not
	// counted. Default "walrelay.inbox.dlq".
	DeadLetterTopic string
	// BatchMaxRecords bounds how many records of a partition share one
	// database transaction. Default 100.
	BatchMaxRecords int
	// BatchMaxTime commits a batch's transaction once it has been open
	// this long, even if more records wait. Default 200ms.
	BatchMaxTime time.Duration
	// MaxBufferedRecords pauses fetching a partition while this many of
	// its records wait to be handled. Default 1000.
	MaxBufferedRecords int
	// ShutdownTimeout bounds how long a stop or a rebalance waits for the
	// batches being handled; their handlers' context is then cancelled
	// (their transactions roll back: their records are handled again by
	// the partition's next owner), and a handler that still has not
	// returned min(ShutdownTimeout, 2s) later is abandoned: the backend
	// of its transaction is ended (pg_terminate_backend), which releases
	// its event's claim, and its goroutine is left to return when it
	// will, its work undone. Default 10s.
	ShutdownTimeout time.Duration
	// Retention is how long the consumer's inbox rows are kept: while
	// Run runs, it deletes those processed longer ago, at its start and
	// then every Retention/24 (an hour at most), as Prune does. An event
	// delivered again after its row was deleted is handled again, so keep
	// rows longer than any redelivery can come: at least the topics'
	// retention.ms plus segment.ms (a record is deleted with its
	// segment, which takes records for segment.ms before it rolls: Kafka's
	// defaults are 7 days each, 14 days together; a group whose offsets
	// expired reads its topics again from their start). Run refuses to
	// start when a topic keeps its records longer (retention.ms +
	// segment.ms; -1 or a compacted topic: for ever), or, for a topic that
	// does not exist yet, the broker's defaults do, before it deletes
	// anything. A replay
	// (walrelay replay, reconcile --replay, dlq replay) of an event
	// handled more than Retention ago is handled again: Run cannot see
	// it coming. Default 30 days; at least an hour; negative: never
	// deleted (call Prune yourself) and not checked.
	Retention time.Duration
	// SessionTimeout is how long the group waits for a consumer that
	// stopped heartbeating (a crash, a cut network) before its partitions
	// move to the others; it heartbeats every tenth of it. Default 10s,
	// against Kafka's 45s: a crashed consumer's partitions stand still
	// that long, and a false alarm (a pause of the network or the process
	// longer than this) costs only a rebalance, since the inbox handles
	// every event once whoever holds its partition. The broker bounds it
	// (group.min.session.timeout.ms, 6s by default): outside, Run returns
	// an error wrapping kerr.InvalidSessionTimeout.
	SessionTimeout time.Duration
	// InstanceID, if set, is a name of this consumer that stays the same
	// across its restarts (a StatefulSet pod's name, a host's): Kafka's
	// static membership. A consumer restarted under its InstanceID takes
	// its partitions back at once, without a rebalance and without
	// waiting for SessionTimeout; a static member that stops (even on
	// SIGTERM) does not leave the group, so its partitions wait for it up
	// to SessionTimeout. Two running consumers must not share one: the
	// broker fences the older, whose Run then returns an error wrapping
	// kerr.FencedInstanceID and naming the id. Empty: dynamic membership.
	InstanceID string
	// Registerer, if set, registers the consumer's metrics
	// (walrelay_inbox_*).
	Registerer prometheus.Registerer
	// Logger logs lifecycle (Info) and failures: retries, dead letters
	// (Warn, with the reason and the error), a stop on a fatal error
	// (Error). Default slog.Default(): a consumer that dead-letters events
	// in silence hides a bug from its owner; pass
	// slog.New(slog.DiscardHandler) to discard.
	Logger *slog.Logger
	// KafkaOpts are extra client options (TLS, SASL, client id).
	KafkaOpts []kgo.Opt
	// TracerProvider, if set, records an OpenTelemetry process span per
	// record handled (each attempt), a child of the span its traceparent
	// header names (walrelay's publish span), current in the handler's
	// context, ended when the record's transaction committed or rolled
	// back; a duplicate skipped and a dead letter are spans that say so
	// (walrelay.inbox.duplicate, walrelay.dead_letter.reason). Nil: none,
	// at no cost.
	TracerProvider trace.TracerProvider
	// Registry, if set, decodes the values in a schema registry's format
	// (Avro, Protobuf, JSON Schema: Message.Decode, Message.Decoded). Nil:
	// those fail; Registry.Decode works without it.
	Registry *Registry
}

// DefaultRetention is Config.Retention's default: 30 days, four times
// Kafka's default retention.ms.
const DefaultRetention = 30 * 24 * time.Hour

// claimVersion is the comment migrations/inbox/0004 sets on the claim
// functions: Run refuses an inbox not migrated that far.
const claimVersion = "walrelay inbox claim, 0004"

// Message is one Kafka record handed to the handler.
type Message struct {
	ID        string // the "id" header, the event id: the record's only one, not empty
	Type      string // the "type" header; empty if the relay left it out (kafka.headers)
	Key       []byte
	Value     []byte // nil for a tombstone
	Headers   map[string][]byte
	Topic     string
	Partition int32
	Offset    int64
	Timestamp time.Time
	// Attempt counts the handler's runs for this record, from 1: every
	// run, whatever ended the one before (the handler's error, a session
	// cut, a server restart, or a batch whose commit failed and is handled
	// again one record per transaction, when the handlers of records that
	// did nothing wrong run again). Greater than 1, the handler's effects
	// inside tx were undone, but anything it did outside (an e-mail, an
	// HTTP call) was done already: make such effects idempotent, keyed on
	// ID. Counted by this process's worker of the partition: a record
	// delivered again after a rebalance or a restart of the process
	// starts at 1 again.
	Attempt int
	// reg is Config.Registry, for Decode.
	reg *Registry
}

// Handler handles one message inside tx, the transaction that also claims
// its id; the claim commits only with the handler's changes. It must not
// commit or roll back tx. An error (or a panic) undoes the message's
// changes and the claim; the message is retried.
type Handler func(ctx context.Context, tx pgx.Tx, m Message) error

// Consumer consumes topics into a Handler, once per event id.
type Consumer struct {
	cfg   Config
	claim string
	table string
	log   *slog.Logger
	m     *metrics
	// tracer is cfg.TracerProvider's, nil without one.
	tracer trace.Tracer

	mu      sync.Mutex
	workers map[topicPartition]*worker
	cl      *kgo.Client
	h       Handler
	fatal   error
	stopRun context.CancelFunc
	// pgStarted is the server's pg_postmaster_start_time as last seen
	// (by Run, or a worker): a new worker's first (worker.pgStarted).
	pgStarted time.Time
}

type topicPartition struct {
	topic     string
	partition int32
}

// New checks cfg, fills its defaults and registers the metrics.
func New(cfg Config) (*Consumer, error) {
	switch {
	case cfg.Postgres == nil:
		return nil, errors.New("inbox: Config.Postgres is not set")
	case len(cfg.Brokers) == 0:
		return nil, errors.New("inbox: Config.Brokers is empty")
	case len(cfg.Topics) == 0:
		return nil, errors.New("inbox: Config.Topics is empty")
	case cfg.Group == "":
		return nil, errors.New("inbox: Config.Group is not set")
	}
	if cfg.Consumer == "" {
		cfg.Consumer = cfg.Group
	}
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	if cfg.Table == "" {
		cfg.Table = "walrelay_inbox"
	}
	if err := migrations.CheckInboxTable(cfg.Schema, cfg.Table); err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 5
	}
	if cfg.RetryBackoffMin <= 0 {
		cfg.RetryBackoffMin = 100 * time.Millisecond
	}
	if cfg.RetryBackoffMax <= 0 {
		cfg.RetryBackoffMax = 10 * time.Second
	}
	if cfg.RetryBackoffMin > cfg.RetryBackoffMax {
		return nil, fmt.Errorf("inbox: RetryBackoffMin %s is above RetryBackoffMax %s", cfg.RetryBackoffMin, cfg.RetryBackoffMax)
	}
	if cfg.DeadLetterTopic == "" {
		cfg.DeadLetterTopic = "walrelay.inbox.dlq"
	}
	for _, t := range cfg.Topics {
		if t == cfg.DeadLetterTopic {
			return nil, fmt.Errorf("inbox: topic %s is both consumed and the dead-letter topic", t)
		}
	}
	if cfg.BatchMaxRecords <= 0 {
		cfg.BatchMaxRecords = 100
	}
	if cfg.BatchMaxTime <= 0 {
		cfg.BatchMaxTime = 200 * time.Millisecond
	}
	if cfg.MaxBufferedRecords <= 0 {
		cfg.MaxBufferedRecords = 1000
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 10 * time.Second
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	switch {
	case cfg.Retention == 0:
		cfg.Retention = DefaultRetention
	case cfg.Retention > 0 && cfg.Retention < time.Hour:
		return nil, fmt.Errorf("inbox: Retention %s: want an hour or more (at least the topics' retention), or negative to keep every row", cfg.Retention)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Consumer{
		cfg:     cfg,
		claim:   migrations.InboxClaimFunction(cfg.Schema, cfg.Table),
		table:   pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize(),
		log:     log.With("component", "inbox", "consumer", cfg.Consumer),
		workers: map[topicPartition]*worker{},
	}
	if cfg.TracerProvider != nil {
		c.tracer = cfg.TracerProvider.Tracer(scopeName)
	}
	var err error
	if c.m, err = newMetrics(cfg.Registerer, cfg.Consumer); err != nil {
		return nil, err
	}
	return c, nil
}

// Migrate creates the default inbox table (public.walrelay_inbox) and its
// claim function in pool's database, if missing: what `walrelay migrate
// --inbox` does.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return migrate(ctx, pool, "public", "walrelay_inbox")
}

// Migrate creates the consumer's inbox table and its claim function, if
// missing.
func (c *Consumer) Migrate(ctx context.Context) error {
	return migrate(ctx, c.cfg.Postgres, c.cfg.Schema, c.cfg.Table)
}

func migrate(ctx context.Context, pool *pgxpool.Pool, schema, table string) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("inbox: connect: %w", err)
	}
	defer conn.Release()
	if err := migrations.ApplyInbox(ctx, conn.Conn(), schema, table); err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	return nil
}

// Prune deletes the consumer's inbox rows processed more than olderThan
// ago, a thousand at a time, and returns how many it deleted. An event
// redelivered after its row was pruned is handled again: keep rows longer
// than any redelivery can come (the topics' retention).
func (c *Consumer) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	q := fmt.Sprintf(`DELETE FROM %[1]s WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM %[1]s WHERE consumer = $1 AND processed_at < now() - make_interval(secs => $2) LIMIT 1000))`, c.table)
	var total int64
	for {
		tag, err := c.cfg.Postgres.Exec(ctx, q, c.cfg.Consumer, olderThan.Seconds())
		if err != nil {
			return total, fmt.Errorf("inbox: prune %s: %w", c.table, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() == 0 {
			return total, nil
		}
	}
}

// checkRetention refuses a Retention shorter than what a topic read
// keeps: a record delivered again (a rebalance, a group whose offsets
// expired and reads from the start) after its inbox row was deleted would
// be handled twice. Kafka deletes a topic's records a segment at a time,
// once the segment's newest record is older than retention.ms, and a
// segment takes records until it rolls (segment.ms after its first): a
// record stays readable up to retention.ms + segment.ms (-1: for ever). A
// compacted topic (cleanup.policy compact without delete) keeps each
// key's latest for ever. A topic that does not exist yet is checked
// against the broker's defaults (log.retention.*, log.roll.*,
// log.cleanup.policy), which it takes when created without its own.
// Brokers that do not answer or refuse DescribeConfigs are not checked (a
// warning).
func (c *Consumer) checkRetention(ctx context.Context) error {
	if c.cfg.Retention < 0 {
		return nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.cfg.Brokers...)}, c.cfg.KafkaOpts...)...)
	if err != nil {
		return fmt.Errorf("inbox: kafka client: %w", err)
	}
	defer cl.Close()
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	cfgs, err := adm.DescribeTopicConfigs(dctx, c.cfg.Topics...)
	if err != nil {
		c.log.Warn("could not read the topics' retention.ms and segment.ms to check Retention against them", "topics", c.cfg.Topics, "retention", c.cfg.Retention, "err", err)
		return nil
	}
	var missing []string
	for _, rc := range cfgs {
		if rc.Err != nil {
			if errors.Is(rc.Err, kerr.UnknownTopicOrPartition) {
				missing = append(missing, rc.Name)
			} else {
				c.log.Warn("could not read a topic's retention.ms and segment.ms to check Retention against them", "topic", rc.Name, "retention", c.cfg.Retention, "err", rc.Err)
			}
			continue
		}
		v := configValues(rc.Configs)
		if err := c.retentionAgainst("topic "+rc.Name, v["cleanup.policy"], v["retention.ms"], v["segment.ms"]); err != nil {
			return err
		}
	}
	if len(missing) == 0 {
		return nil
	}
	bcfgs, err := adm.DescribeBrokerConfigs(dctx)
	if err == nil && len(bcfgs) > 0 && bcfgs[0].Err != nil {
		err = bcfgs[0].Err
	}
	if err != nil || len(bcfgs) == 0 {
		c.log.Warn("topics that do not exist yet: could not read the broker's defaults (log.retention.ms, log.roll.ms) to check Retention against what they will keep", "topics", missing, "retention", c.cfg.Retention, "err", err)
		return nil
	}
	v := configValues(bcfgs[0].Configs)
	retention := firstOf(v["log.retention.ms"], scaled(v["log.retention.minutes"], 60000), scaled(v["log.retention.hours"], 3600000))
	roll := firstOf(v["log.roll.ms"], scaled(v["log.roll.hours"], 3600000))
	return c.retentionAgainst("topic "+strings.Join(missing, ", ")+" (it does not exist yet: created without configs of its own, it takes the broker's defaults log.cleanup.policy, log.retention.ms, log.roll.ms)",
		v["log.cleanup.policy"], retention, roll)
}

// kafkaSegmentMs is Kafka's default segment.ms (log.roll.hours 168): 7
// days, taken when a topic's is not known.
const kafkaSegmentMs = 7 * 24 * 3600 * 1000

// retentionAgainst refuses Retention when what (a topic, or topics) keeps
// its records longer: by policy (compacted), or retention.ms + segment.ms
// (segment defaulting to Kafka's). An unknown retention is not checked.
func (c *Consumer) retentionAgainst(what, policy, retention, segment string) error {
	fix := "set Config.Retention to at least that, or negative to keep every row (and prune with Consumer.Prune)"
	if strings.Contains(policy, "compact") && !strings.Contains(policy, "delete") {
		return fmt.Errorf("inbox: %s is compacted (cleanup.policy=%s): it keeps each key's latest record for ever, longer than the inbox's Retention %s, so a record read again after its inbox row was deleted would be handled twice; %s", what, policy, c.cfg.Retention, fix)
	}
	ms, err := strconv.ParseInt(retention, 10, 64)
	if err != nil {
		return nil
	}
	if ms < 0 {
		return fmt.Errorf("inbox: %s keeps its records for ever (retention.ms=%d), longer than the inbox's Retention %s, so a record read again after its inbox row was deleted would be handled twice; %s", what, ms, c.cfg.Retention, fix)
	}
	seg, err := strconv.ParseInt(segment, 10, 64)
	if err != nil || seg < 0 {
		seg = kafkaSegmentMs
	}
	if kept := time.Duration(ms+seg) * time.Millisecond; kept > c.cfg.Retention {
		return fmt.Errorf("inbox: %s keeps its records up to %s (retention.ms=%d, plus segment.ms=%d: a record is deleted with its segment, which takes records for segment.ms before it rolls), longer than the inbox's Retention %s, so a record read again after its inbox row was deleted would be handled twice; %s", what, kept, ms, seg, c.cfg.Retention, fix)
	}
	return nil
}

// configValues maps the configs that have a value to it.
func configValues(cfgs []kadm.Config) map[string]string {
	v := make(map[string]string, len(cfgs))
	for _, cf := range cfgs {
		if cf.Value != nil {
			v[cf.Key] = *cf.Value
		}
	}
	return v
}

// scaled is the number of s times unit, as text, or "" if s is not a
// number.
func scaled(s string, unit int64) string {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return ""
	}
	if n < 0 {
		return "-1"
	}
	return strconv.FormatInt(n*unit, 10)
}

// firstOf is the first of vs that is not empty.
func firstOf(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// retain deletes the inbox rows older than Retention until ctx ends: at
// once, then every Retention/24 (an hour at most).
func (c *Consumer) retain(ctx context.Context) {
	every := min(c.cfg.Retention/24, time.Hour)
	for {
		n, err := c.Prune(ctx, c.cfg.Retention)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			c.log.Warn("delete the inbox rows past retention; trying again later", "retention", c.cfg.Retention, "err", err)
		case n > 0:
			c.log.Info("deleted the inbox rows past retention", "rows", n, "retention", c.cfg.Retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// Run consumes until ctx ends (it then finishes the batches being handled,
// commits their offsets, leaves the group and returns nil) or a fatal
// error (the brokers refuse the group, a topic or SessionTimeout, or
// another consumer runs with its InstanceID), which it returns.
func (c *Consumer) Run(ctx context.Context, h Handler) error {
	if h == nil {
		return errors.New("inbox: Run needs a handler")
	}
	var exists bool
	if err := c.cfg.Postgres.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", c.table).Scan(&exists); err != nil {
		return fmt.Errorf("inbox: look up the inbox table %s: %w", c.table, err)
	}
	if !exists {
		return fmt.Errorf("inbox: the inbox table %s does not exist: run walrelay migrate --inbox, or inbox.Migrate", c.table)
	}
	// The comment is set by migrations/inbox/0004: claims of both forms
	// serialize on (consumer, event id) (0003) and refuse a transaction
	// that is not READ COMMITTED (0004).
	if err := c.cfg.Postgres.QueryRow(ctx, `SELECT coalesce(obj_description(to_regprocedure($2), 'pg_proc') = $3, false) AND EXISTS (
		SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'topic' AND NOT attisdropped)`, c.table, c.claim+"(text, text, text)", claimVersion).Scan(&exists); err != nil {
		return fmt.Errorf("inbox: look up the claim function %s: %w", c.claim, err)
	}
	if !exists {
		return fmt.Errorf("inbox: the inbox table %s or its claim function %s is of an earlier layout (keyed on the event id alone, not the topic too, claims that do not wait for each other, or claims that do not refuse a transaction other than READ COMMITTED): run walrelay migrate --inbox, or inbox.Migrate", c.table, c.claim)
	}
	if err := c.checkRetention(ctx); err != nil {
		return err
	}
	var started time.Time
	if err := c.cfg.Postgres.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&started); err != nil {
		return fmt.Errorf("inbox: read the server's start time: %w", err)
	}
	c.serverStarted(started)
	runCtx, stop := context.WithCancel(ctx)
	var retaining sync.WaitGroup
	defer func() {
		stop()
		retaining.Wait() // a Prune in flight ends with runCtx
	}()
	if c.cfg.Retention > 0 {
		retaining.Add(1)
		go func() {
			defer retaining.Done()
			c.retain(runCtx)
		}()
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topics...),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), // a transactional relay's aborted records are not events
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(time.Second),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.AllowAutoTopicCreation(),
		kgo.SessionTimeout(c.cfg.SessionTimeout),
		kgo.HeartbeatInterval(c.cfg.SessionTimeout / 10),
	}, c.cfg.KafkaOpts...)
	if c.cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(c.cfg.InstanceID))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("inbox: kafka client: %w", err)
	}
	c.mu.Lock()
	c.cl, c.h, c.stopRun = cl, h, stop
	c.mu.Unlock()
	c.log.Info("inbox consumer started", "group", c.cfg.Group, "topics", c.cfg.Topics)
	for {
		fs := cl.PollRecords(runCtx, c.cfg.MaxBufferedRecords)
		if runCtx.Err() != nil || fs.IsClientClosed() {
			cl.AllowRebalance() // leaving the group below is a rebalance
			break
		}
		fs.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			if errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.GroupAuthorizationFailed) {
				c.fail(fmt.Errorf("consume %s: %w", topic, err))
				return
			}
			if errors.Is(err, kerr.FencedInstanceID) {
				// Another running consumer joined the group under this
				// InstanceID. Rejoining would fence it in turn, and the
				// two would take the slot from each other for ever.
				c.fail(fmt.Errorf("group %s: another consumer is running with InstanceID %q (each must have its own): %w", c.cfg.Group, c.cfg.InstanceID, err))
				return
			}
			if errors.Is(err, kerr.InvalidSessionTimeout) {
				c.fail(fmt.Errorf("group %s: the broker refuses SessionTimeout %s (outside group.min.session.timeout.ms and group.max.session.timeout.ms): %w", c.cfg.Group, c.cfg.SessionTimeout, err))
				return
			}
			c.log.Warn("fetch failed; retrying", "topic", topic, "partition", p, "err", err)
		})
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			c.mu.Lock()
			w := c.workers[topicPartition{p.Topic, p.Partition}]
			c.mu.Unlock()
			if w != nil { // else revoked meanwhile: its new owner fetches them
				w.push(p.Records, p.HighWatermark)
			}
		})
		cl.AllowRebalance()
	}
	// Finish what is being handled, commit its offsets, leave the group.
	c.stopWorkers(nil, false)
	cctx, cancel := context.WithTimeout(context.Background(), c.cfg.ShutdownTimeout)
	if err := cl.CommitMarkedOffsets(cctx); err != nil {
		c.log.Warn("commit offsets at shutdown; their records will be skipped by the inbox when delivered again", "err", err)
	}
	cancel()
	cl.Close()
	c.mu.Lock()
	err = c.fatal
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	c.log.Info("inbox consumer stopped")
	return nil
}

// serverStarted records started, the server's pg_postmaster_start_time
// as just read, as the last seen, and returns the one seen before (zero
// the first time): the start time a worker created now takes as its own.
func (c *Consumer) serverStarted(started time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.pgStarted
	if started.After(prev) {
		c.pgStarted = started
	}
	return prev
}

// fail stops Run with err.
func (c *Consumer) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fatal == nil {
		c.fatal = err
		c.log.Error("inbox consumer stopping", "err", err)
	}
	if c.stopRun != nil {
		c.stopRun()
	}
}

func (c *Consumer) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, parts := range assigned {
		for _, p := range parts {
			tp := topicPartition{topic, p}
			if c.workers[tp] != nil {
				continue
			}
			w := newWorker(c, cl, tp)
			c.workers[tp] = w
			go w.run()
		}
	}
	c.log.Info("partitions assigned", "partitions", fmt.Sprint(assigned))
}

// revoked lets the revoked partitions' workers finish their batches, then
// commits their offsets before the partitions go to another member.
func (c *Consumer) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	c.stopWorkers(revoked, false)
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		c.log.Warn("commit offsets of revoked partitions; their new owner skips the records the inbox holds", "err", err)
	}
	c.log.Info("partitions revoked", "partitions", fmt.Sprint(revoked))
}

// lost stops the lost partitions' workers at once: another member may
// handle them already (the inbox keeps each event once).
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.stopWorkers(lost, true)
	c.log.Warn("partitions lost", "partitions", fmt.Sprint(lost))
}

// stopWorkers stops the workers of parts (all when nil) and waits for
// them: after their current batch, or at once when abort is set. It waits
// ShutdownTimeout at most, then cancels the batches' handlers (their
// transactions roll back) and waits for them min(ShutdownTimeout, 2s)
// more; a worker still running then (its handler ignores its context) is
// abandoned (worker.abandon), so a stop or a rebalance never waits longer.
func (c *Consumer) stopWorkers(parts map[string][]int32, abort bool) {
	c.mu.Lock()
	var ws []*worker
	for tp, w := range c.workers {
		if parts != nil && !contains(parts[tp.topic], tp.partition) {
			continue
		}
		ws = append(ws, w)
		delete(c.workers, tp)
	}
	c.mu.Unlock()
	for _, w := range ws {
		w.stop(abort)
	}
	if late := waitWorkers(ws, c.cfg.ShutdownTimeout); len(late) > 0 {
		for _, w := range late {
			w.stop(true)
		}
		for _, w := range waitWorkers(late, min(abortGrace, c.cfg.ShutdownTimeout)) {
			w.abandon()
		}
	}
	for _, w := range ws {
		w.resume()
		c.m.lag.DeleteLabelValues(w.tp.topic, fmt.Sprint(w.tp.partition))
		c.m.registryHeld.DeleteLabelValues(w.tp.topic, fmt.Sprint(w.tp.partition))
	}
}

// waitWorkers waits up to d for the workers ws to end, and returns those
// still running.
func waitWorkers(ws []*worker, d time.Duration) []*worker {
	t := time.NewTimer(d)
	defer t.Stop()
	for i, w := range ws {
		select {
		case <-w.done:
		case <-t.C:
			var late []*worker
			for _, w := range ws[i:] {
				select {
				case <-w.done:
				default:
					late = append(late, w)
				}
			}
			return late
		}
	}
	return nil
}

func contains(ps []int32, p int32) bool {
	for _, x := range ps {
		if x == p {
			return true
		}
	}
	return false
}

// handlerError is the failure of a handler, whatever it wraps (io.EOF of
// an empty payload, a net.Error of a call to a service that is down): it
// counts an attempt and ends in the dead-letter topic after MaxAttempts.
// The inbox's own connection is known to be up when a handler's failure
// is reported: the savepoint was rolled back on it.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// isHandlerError reports whether err is a handler's failure.
func isHandlerError(err error) bool {
	var he *handlerError
	return errors.As(err, &he)
}

// connectionTrouble reports whether err, a failure of the inbox's own
// database work (never a handler's), is the connection's (or the
// network's) rather than a record's: retried without limit.
func connectionTrouble(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P") || strings.HasPrefix(pgErr.Code, "53")
	}
	var ne net.Error
	return errors.As(err, &ne) || pgconn.Timeout(err) || pgconn.SafeToRetry(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		strings.Contains(err.Error(), "conn closed") || strings.Contains(err.Error(), "failed to connect")
}
