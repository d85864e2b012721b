package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/walrelay/walrelay/migrations"
)

// Consumer consumes topics into a Handler, once per event id.
type Consumer struct {
	cfg   Config
	claim string
	table string
	// versions is the versions table (Config.VersionOrder), quoted.
	versions string
	log      *slog.Logger
	m        *metrics
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
	if cfg.VersionWait <= 0 {
		cfg.VersionWait = DefaultVersionWait
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
		cfg:      cfg,
		claim:    migrations.InboxClaimFunction(cfg.Schema, cfg.Table),
		table:    pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize(),
		versions: migrations.InboxVersionsTable(cfg.Schema, cfg.Table),
		log:      log.With("component", "inbox", "consumer", cfg.Consumer),
		workers:  map[topicPartition]*worker{},
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
	if err := c.checkVersions(ctx); err != nil {
		return err
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
