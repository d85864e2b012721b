// Package config is walrelay's configuration: every key declared once, in
// Config.keys, with its default and meaning, read from a YAML file, the
// environment (WALRELAY_ + the key upper-cased, dots as underscores) and
// flags, in that order of precedence; unknown keys and misspelt variables
// are refused with the likely key, all of them at once (Problems). It maps the configuration onto the
// relay's, the sink's (TLS, SASL) and the migrations' settings, reads the
// secret files, and redacts secrets from what is logged or printed. Tests
// keep walrelay.example.yaml in step with the keys, and docs/configuration.md's
// table is generated from them (Reference).
package config

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/walrelay/walrelay/poll"
	"github.com/walrelay/walrelay/sink"
	"github.com/walrelay/walrelay/sink/record"
)

// Config is walrelay's whole configuration. Each field has one key; the key
// is its name in the YAML file, WALRELAY_ plus the key upper-cased with dots
// as underscores is its environment variable, and --key is its flag. Flags
// override the environment, which overrides the file.
type Config struct {
	Source   string
	Postgres struct {
		DSN             string
		Slot            string
		Publication     string
		Table           string
		CreateSlot      bool
		SlotFailover    bool
		AllowRowFilter  bool
		StatusInterval  time.Duration
		ReceiveTimeout  time.Duration
		PasswordFile    string
		MaxMessageBytes int
	}
	Outbox struct {
		IDColumn            string
		AggregateTypeColumn string
		AggregateIDColumn   string
		TypeColumn          string
		PayloadColumn       string
		HeaderColumns       []string
		Messages            bool
		MessagePrefix       string
		IgnorePrefixes      []string
		TimestampColumn     string
		OrderColumn         string
		PartitionColumn     string
		TraceColumn         string
		VersionColumn       string
		Tables              []OutboxTable
	}
	Kafka struct {
		Brokers             []string
		Topic               string
		TopicRegex          string
		AllowedTopics       []string
		TombstoneOnEmpty    bool
		ExpandJSONPayload   bool
		CloudEvents         string
		CloudEventsSource   string
		Headers             []string
		DLQTopic            string
		ClientID            string
		Compression         string
		KeyFormat           string
		ValueFormat         string
		Linger              time.Duration
		BatchMaxBytes       int
		MaxBufferedRecords  int
		MaxBufferedBytes    int
		AutoCreateTopics    bool
		ExactlyOnce         bool
		TransactionalID     string
		TakeoverID          string
		AcceptTimeline      int
		TransactionInterval time.Duration
		TransactionTimeout  time.Duration
		RefusalStopAfter    time.Duration
		RequestTimeout      time.Duration
		OffsetsTopic        string
		TLS                 struct {
			Enabled                               bool
			CAFile, CertFile, KeyFile, ServerName string
		}
		SASL struct {
			Mechanism, Username, Password, PasswordFile string
		}
		SchemaRegistry struct {
			URL, Username, Password, PasswordFile string
			AutoRegister                          bool
			IDKind                                string
			Timeout                               time.Duration
			TLSCAFile, TLSCertFile, TLSKeyFile    string
			// The schema-first formats (schemafirst.go).
			SubjectStrategy, Subject, Version, Message string
			Subjects                                   []string
		}
	}
	Poll struct {
		Interval    time.Duration
		BatchSize   int
		Lease       time.Duration
		MaxAttempts int
		Ordering    string
		OnDead      string
		WorkerID    string
	}
	Admin struct {
		Listen string
		Pprof  bool
	}
	Heartbeat struct {
		Interval time.Duration
	}
	Tracing struct {
		Enabled   bool
		RootSpans bool
	}
	Log struct {
		Level            string
		Format           string
		ProgressInterval time.Duration
	}
	ShutdownTimeout time.Duration
	MemoryLimit     int

	pgPassword string // read from postgres.password_file
}

// validate checks what each key alone can tell; the packages' New check the
// rest.
func (c *Config) validate(needKafka bool) error {
	if c.Postgres.DSN == "" {
		return errors.New("postgres.dsn is not set (set " + EnvName("postgres.dsn") + ", --postgres.dsn or postgres.dsn in the config file)")
	}
	switch c.Source {
	case "wal":
	case "poll":
		if c.Kafka.ExactlyOnce {
			return errors.New("kafka.exactly_once needs source wal: the poll source marks rows in PostgreSQL after Kafka acknowledged them, outside any Kafka transaction, so it delivers at least once")
		}
		if c.Outbox.Messages {
			return errors.New("outbox.messages needs source wal: the poll source reads no WAL, so no logical decoding message (walrelay_emit inserts a row there)")
		}
		if c.Poll.BatchSize < 1 || c.Poll.MaxAttempts < 1 {
			return fmt.Errorf("poll.batch_size %d, poll.max_attempts %d: want at least 1", c.Poll.BatchSize, c.Poll.MaxAttempts)
		}
		if c.Poll.Interval <= 0 {
			return fmt.Errorf("poll.interval %s: want a positive duration", c.Poll.Interval)
		}
		if err := poll.CheckSettings(c.Poll.Ordering, c.Poll.OnDead, c.Poll.Lease); err != nil {
			return err
		}
	default:
		return fmt.Errorf("source %q: want wal or poll", c.Source)
	}
	if c.Kafka.ExactlyOnce && c.Kafka.TransactionInterval <= 0 {
		return fmt.Errorf("kafka.transaction_interval %s: want a positive duration", c.Kafka.TransactionInterval)
	}
	if c.Kafka.ExpandJSONPayload && (c.Kafka.ValueFormat == "" || c.Kafka.ValueFormat == string(record.FormatRaw)) {
		return errors.New("kafka.expand_json_payload needs kafka.value_format json, json_schema or avro (raw writes the payload as stored)")
	}
	if err := c.checkSchemaRegistry(); err != nil {
		return err
	}
	if c.Kafka.RequestTimeout < time.Second {
		return fmt.Errorf("kafka.request_timeout %s: want 1s or more", c.Kafka.RequestTimeout)
	}
	if c.Kafka.AcceptTimeline < 0 || c.Kafka.AcceptTimeline > math.MaxInt32 {
		return fmt.Errorf("kafka.accept_timeline %d: want a timeline (1 or more), or 0", c.Kafka.AcceptTimeline)
	}
	if c.Kafka.ExactlyOnce && c.Kafka.TransactionInterval >= c.Kafka.TransactionTimeout/4 {
		return fmt.Errorf("kafka.transaction_interval %s must be under a quarter of kafka.transaction_timeout %s", c.Kafka.TransactionInterval, c.Kafka.TransactionTimeout)
	}
	if needKafka && len(c.Kafka.Brokers) == 0 {
		return errors.New("kafka.brokers is not set (set " + EnvName("kafka.brokers") + ", --kafka.brokers or kafka.brokers in the config file)")
	}
	if err := sink.CheckBrokers(c.Kafka.Brokers); err != nil {
		return fmt.Errorf("kafka.brokers %w (SASL credentials go in kafka.sasl.username and kafka.sasl.password_file)", err)
	}
	if _, _, err := c.Table(); err != nil {
		return err
	}
	if err := c.checkTables(); err != nil {
		return err
	}
	if err := c.OutboxConfig().Validate(); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	if c.Tracing.Enabled {
		// With tracing on, the traceparent and tracestate headers are the
		// trace context that walrelay's spans continue and write: only a
		// trace column's text, checked to W3C's shape, may give them.
		for _, l := range c.OutboxConfig().Layouts() {
			for _, h := range l.HeaderColumns {
				if n := strings.ToLower(l.HeaderName(h)); n == "traceparent" || n == "tracestate" {
					return fmt.Errorf("outbox.header_columns: column %q of %s gives the header %s, which with tracing.enabled is the trace context walrelay's spans continue: name the column in outbox.trace_column instead (its text is checked to W3C's shape), or name its header otherwise (column:name)", h, l.Name(), n)
				}
			}
		}
	}
	k := c.Kafka
	if k.CloudEvents != "" && k.CloudEvents != "binary" {
		return fmt.Errorf("kafka.cloudevents %q: want binary, or empty for none", k.CloudEvents)
	}
	for _, h := range k.Headers {
		if h != record.HeaderID && !slices.Contains(record.OptionalHeaders[:], h) {
			return fmt.Errorf("kafka.headers: unknown header %q: want any of %s (%s is always sent)", h, strings.Join(record.OptionalHeaders[:], ", "), record.HeaderID)
		}
	}
	if err := record.CheckRouting(k.Topic, k.TopicRegex); err != nil {
		return fmt.Errorf("kafka.topic, kafka.topic_regex: %w", err)
	}
	if err := record.CheckAllowedTopics(k.AllowedTopics); err != nil {
		return fmt.Errorf("kafka.allowed_topics: %w", err)
	}
	switch {
	case k.BatchMaxBytes < 1024:
		return fmt.Errorf("kafka.batch_max_bytes %d: want at least 1024", k.BatchMaxBytes)
	case k.MaxBufferedRecords < 2:
		return fmt.Errorf("kafka.max_buffered_records %d: want at least 2 (half in flight, half queued)", k.MaxBufferedRecords)
	case k.MaxBufferedBytes < k.BatchMaxBytes:
		return fmt.Errorf("kafka.max_buffered_bytes %d is below kafka.batch_max_bytes %d: a large record could never be buffered", k.MaxBufferedBytes, k.BatchMaxBytes)
	}
	if n := c.Postgres.MaxMessageBytes; n != 0 && n < 64<<10 {
		return fmt.Errorf("postgres.max_message_bytes %d: want at least 65536, or 0 for 2 × kafka.batch_max_bytes + 1 MiB", n)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log.level %q: want debug, info, warn or error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		return fmt.Errorf("log.format %q: want text or json", c.Log.Format)
	}
	return nil
}
