// Package config is walrelay's configuration: every key declared once, in
// Config.keys, with its default and meaning, read from a YAML file, the
// environment (WALRELAY_ + the key upper-cased, dots as underscores) and
// flags, in that order of precedence; unknown keys and misspelt variables
// are refused with the likely key. It maps the configuration onto the
// relay's, the sink's (TLS, SASL) and the migrations' settings, reads the
// secret files, and redacts secrets from what is logged or printed. Tests
// keep walrelay.example.yaml and the README's table in step with the keys.
package config

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/walrelay/walrelay/poll"
	"github.com/walrelay/walrelay/sink"
)

// Config is walrelay's whole configuration. Each field has one key; the key
// is its name in the YAML file, WALRELAY_ plus the key upper-cased with dots
// as underscores is its environment variable, and --key is its flag. Flags
// override the environment, which overrides the file.
type Config struct {
	Source   string
	Postgres struct {
		DSN            string
		Slot           string
		Publication    string
		Table          string
		CreateSlot     bool
		SlotFailover   bool
		AllowRowFilter bool
		StatusInterval time.Duration
		ReceiveTimeout time.Duration
		PasswordFile   string
	}
	Outbox struct {
		IDColumn            string
		AggregateTypeColumn string
		AggregateIDColumn   string
		TypeColumn          string
		PayloadColumn       string
		HeaderColumns       []string
		MessagePrefix       string
		IgnorePrefixes      []string
		TimestampColumn     string
		OrderColumn         string
		PartitionColumn     string
		TraceColumn         string
		Tables              []OutboxTable
	}
	Kafka struct {
		Brokers             []string
		Topic               string
		TopicRegex          string
		TombstoneOnEmpty    bool
		ExpandJSONPayload   bool
		CloudEvents         string
		CloudEventsSource   string
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
		RequestTimeout      time.Duration
		OffsetsTopic        string
		TLS                 struct {
			Enabled                               bool
			CAFile, CertFile, KeyFile, ServerName string
		}
		SASL struct {
			Mechanism, Username, Password, PasswordFile string
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
	Log struct {
		Level            string
		Format           string
		ProgressInterval time.Duration
	}
	ShutdownTimeout time.Duration
	MemoryLimit     int

	pgPassword string // read from postgres.password_file
}

// key is one configuration key: its name, its help text and how to set and
// show its field.
type key struct {
	name    string
	help    string
	redact  func(string) string // for the start-up log: hides a secret
	set     func(string) error
	show    func() string
	setFrom string // where the value came from: default, file, env, flag
	// structured keys take a list of mappings in the file (their value is
	// its JSON text); the others, a scalar or a list of plain values.
	structured bool
}

func str(p *string, def string) (func(string) error, func() string) {
	*p = def
	return func(v string) error { *p = v; return nil }, func() string { return *p }
}

func list(p *[]string, def []string) (func(string) error, func() string) {
	*p = def
	return func(v string) error {
			*p = nil
			for _, s := range strings.Split(v, ",") {
				if s = strings.TrimSpace(s); s != "" {
					*p = append(*p, s)
				}
			}
			return nil
		}, func() string {
			return strings.Join(*p, ",")
		}
}

func boolean(p *bool, def bool) (func(string) error, func() string) {
	*p = def
	return func(v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("want true or false, got %q", v)
		}
		*p = b
		return nil
	}, func() string { return strconv.FormatBool(*p) }
}

func duration(p *time.Duration, def time.Duration) (func(string) error, func() string) {
	*p = def
	return func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("want a duration such as 500ms or 2s, got %q", v)
		}
		*p = d
		return nil
	}, func() string { return p.String() }
}

func integer(p *int, def int) (func(string) error, func() string) {
	*p = def
	return func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("want a whole number, got %q", v)
		}
		*p = n
		return nil
	}, func() string { return strconv.Itoa(*p) }
}

// keys lists every key of c with its default, which it sets.
func (c *Config) keys() []*key {
	var ks []*key
	add := func(name, help string, f func(string) error, s func() string) *key {
		k := &key{name: name, help: help, set: f, show: s, setFrom: "default"}
		ks = append(ks, k)
		return k
	}
	f, s := str(&c.Source, "wal")
	add("source", "where events come from: wal (a logical replication slot) or poll (the outbox table polled, for databases without logical replication; run walrelay migrate --poll)", f, s)
	dsn, dsnShow := str(&c.Postgres.DSN, "")
	add("postgres.dsn", "PostgreSQL connection string of the database with the outbox (required)", dsn, dsnShow).redact = RedactDSN
	f, s = str(&c.Postgres.Slot, "walrelay")
	add("postgres.slot", "logical replication slot", f, s)
	f, s = str(&c.Postgres.Publication, "walrelay_outbox")
	add("postgres.publication", "publication of the outbox table", f, s)
	f, s = str(&c.Postgres.Table, "public.outbox")
	add("postgres.table", "outbox table, schema.table", f, s)
	f, s = boolean(&c.Postgres.CreateSlot, true)
	add("postgres.create_slot", "create the publication and the slot at start if they are missing (a slot walrelay created that is gone is never created again: walrelay slot create)", f, s)
	f, s = boolean(&c.Postgres.SlotFailover, false)
	add("postgres.slot_failover", "mark the slot for failover at start (PostgreSQL 17+), so that a physical standby with sync_replication_slots = on keeps a copy that survives its promotion", f, s)
	f, s = boolean(&c.Postgres.AllowRowFilter, false)
	add("postgres.allow_row_filter", "accept a row filter on the outbox in the publication: for a shard of a sharded outbox, whose other rows other shards publish", f, s)
	f, s = duration(&c.Postgres.StatusInterval, time.Second)
	add("postgres.status_interval", "longest time between standby status updates", f, s)
	f, s = duration(&c.Postgres.ReceiveTimeout, 30*time.Second)
	add("postgres.receive_timeout", "reconnect when nothing, not even a keepalive, arrived from the server for this long (at least 4 status intervals)", f, s)
	f, s = str(&c.Postgres.PasswordFile, "")
	add("postgres.password_file", "file holding the PostgreSQL password, used where the DSN has none", f, s)

	f, s = str(&c.Outbox.IDColumn, "id")
	add("outbox.id_column", "column of the event id (Kafka header id)", f, s)
	f, s = str(&c.Outbox.AggregateTypeColumn, "aggregatetype")
	add("outbox.aggregate_type_column", "column that routes the topic", f, s)
	f, s = str(&c.Outbox.AggregateIDColumn, "aggregateid")
	add("outbox.aggregate_id_column", "column of the Kafka key", f, s)
	f, s = str(&c.Outbox.TypeColumn, "type")
	add("outbox.type_column", "column of the event type (Kafka header type)", f, s)
	f, s = str(&c.Outbox.PayloadColumn, "payload")
	add("outbox.payload_column", "column of the Kafka value; NULL gives a tombstone", f, s)
	f, s = list(&c.Outbox.HeaderColumns, nil)
	add("outbox.header_columns", "extra columns copied into Kafka headers of the same name, comma-separated; column:name names the header otherwise", f, s)
	f, s = str(&c.Outbox.MessagePrefix, "walrelay")
	add("outbox.message_prefix", "prefix of logical decoding messages published as events", f, s)
	f, s = list(&c.Outbox.IgnorePrefixes, nil)
	add("outbox.ignore_message_prefixes", "prefixes of other programs' logical decoding messages, ignored; a message under any other prefix stops walrelay", f, s)
	f, s = str(&c.Outbox.TimestampColumn, "")
	add("outbox.timestamp_column", "a timestamp, timestamptz or date column: the Kafka record's timestamp (NULL or empty: the time of publishing), and the time windows of replay, reconcile and prune (empty: the time in UUIDv7 ids)", f, s)
	f, s = str(&c.Outbox.OrderColumn, "")
	add("outbox.order_column", "a column whose order is the rows' insert order (an identity or sequence; migrate creates it as bigint GENERATED BY DEFAULT AS IDENTITY): the order of the rows replay and reconcile --replay send (empty: the timestamp column or UUIDv7 ids, then each transaction's insert order)", f, s)
	f, s = str(&c.Outbox.TraceColumn, "")
	add("outbox.trace_column", "a text column of the writer's trace context (a W3C traceparent, or Debezium's tracingspancontext Properties text): the traceparent and tracestate headers", f, s)
	f, s = tables(&c.Outbox.Tables)
	add("outbox.tables", "several outbox tables read through one slot and publication: a YAML list (in the environment or a flag, its JSON or YAML flow text) of entries with table (schema.table, required) and any of the column keys of outbox.* and topic, topic_regex of kafka.*; an entry's empty key takes that key's value; postgres.table is then unused", f, s).structured = true
	f, s = str(&c.Outbox.PartitionColumn, "")
	add("outbox.partition_column", "an integer column whose value is the record's Kafka partition (NULL or empty: the key's); a partition the topic lacks is dead-lettered", f, s)

	f, s = list(&c.Kafka.Brokers, nil)
	add("kafka.brokers", "seed brokers, host:port, comma-separated (required)", f, s)
	f, s = str(&c.Kafka.Topic, "outbox.event.{aggregatetype}")
	add("kafka.topic", "topic template; {aggregatetype} and {type} are replaced; with kafka.topic_regex, the replacement ($1, ${name})", f, s)
	f, s = str(&c.Kafka.TopicRegex, "")
	add("kafka.topic_regex", "a regular expression the routing column's whole value must match; kafka.topic then names its groups as Java does ($1, ${name}), and a value that does not match is the topic itself (Debezium's route.topic.regex)", f, s)
	f, s = boolean(&c.Kafka.TombstoneOnEmpty, false)
	add("kafka.tombstone_on_empty_payload", "a NULL or blank payload gives a tombstone (a null value) whatever kafka.value_format (Debezium's route.tombstone.on.empty.payload)", f, s)
	f, s = str(&c.Kafka.KeyFormat, "raw")
	add("kafka.key_format", "the key as Kafka Connect's converters write it: raw (StringConverter), json or json_schema (JsonConverter, schemas.enable false or true)", f, s)
	f, s = str(&c.Kafka.ValueFormat, "raw")
	add("kafka.value_format", "the value likewise: raw (the payload as stored; NULL: a tombstone), json or json_schema", f, s)
	f, s = boolean(&c.Kafka.ExpandJSONPayload, false)
	add("kafka.expand_json_payload", "with kafka.value_format json or json_schema: a json, jsonb or text payload that is a JSON object or array is written as that JSON value (json_schema: with the schema Debezium infers from it) instead of a string of its text (Debezium's table.expand.json.payload)", f, s)
	f, s = str(&c.Kafka.CloudEvents, "")
	add("kafka.cloudevents", "binary: add the CloudEvents attributes as ce_ headers (the Kafka binding's binary mode; the value stays the payload); empty: none", f, s)
	f, s = str(&c.Kafka.CloudEventsSource, "")
	add("kafka.cloudevents_source", "ce_source of kafka.cloudevents; empty: /<database>/<schema>.<table>", f, s)
	f, s = str(&c.Kafka.DLQTopic, "walrelay.dlq")
	add("kafka.dlq_topic", "dead-letter topic", f, s)
	f, s = str(&c.Kafka.ClientID, "walrelay")
	add("kafka.client_id", "Kafka client id", f, s)
	f, s = str(&c.Kafka.Compression, "lz4")
	add("kafka.compression", "none, gzip, snappy, lz4 or zstd", f, s)
	f, s = duration(&c.Kafka.Linger, 5*time.Millisecond)
	add("kafka.linger", "how long walrelay, with nothing in flight, waits for more records before it sends; 0 sends at once", f, s)
	f, s = integer(&c.Kafka.BatchMaxBytes, 1000012)
	add("kafka.batch_max_bytes", "largest record batch (at least 1024); larger records are dead-lettered", f, s)
	f, s = integer(&c.Kafka.MaxBufferedRecords, 5000)
	add("kafka.max_buffered_records", "records produced and not yet acknowledged, at most (at least 2: half in flight, half queued)", f, s)
	f, s = integer(&c.Kafka.MaxBufferedBytes, 16<<20)
	add("kafka.max_buffered_bytes", "bytes produced and not yet acknowledged, at most (at least kafka.batch_max_bytes)", f, s)
	f, s = boolean(&c.Kafka.AutoCreateTopics, true)
	add("kafka.auto_create_topics", "ask the broker to create missing topics", f, s)
	f, s = boolean(&c.Kafka.ExactlyOnce, false)
	add("kafka.exactly_once", "produce in Kafka transactions fenced by the source position: a read_committed consumer sees each event once, across crashes", f, s)
	f, s = str(&c.Kafka.TransactionalID, "")
	add("kafka.transactional_id", "transactional id of kafka.exactly_once; empty: walrelay-<system identifier>-<database>-<slot>, stable across restarts", f, s)
	f, s = str(&c.Kafka.TakeoverID, "")
	add("kafka.transactional_id_takeover", "transactional id whose committed position of the slot this relay takes over, fencing it (after a change of kafka.transactional_id); empty: a position committed under another id than kafka.transactional_id is refused", f, s)
	f, s = integer(&c.Kafka.AcceptTimeline, 0)
	add("kafka.accept_timeline", "timeline of the database onto which exactly-once carries a committed position that lies past the end of its own timeline (after a failover or restore that lost WAL, once reconciled): this timeline's events from the switch on are published; 0: refused", f, s)
	f, s = duration(&c.Kafka.TransactionInterval, 10*time.Millisecond)
	add("kafka.transaction_interval", "longest a Kafka transaction of kafka.exactly_once stays open once it holds an event (consumers see nothing before the commit)", f, s)
	f, s = duration(&c.Kafka.RequestTimeout, 10*time.Second)
	add("kafka.request_timeout", "how long walrelay waits for a broker's answer before it takes the broker as gone and retries on the partition's new leader (half the broker's wait for its in-sync replicas, half the network's); 10s notices a frozen or cut-off leader about when Kafka fences it (broker.session.timeout.ms, 9s by default): set it near that of your cluster; a slower broker is retried, each record kept once", f, s)
	f, s = duration(&c.Kafka.TransactionTimeout, time.Minute)
	add("kafka.transaction_timeout", "transaction timeout of kafka.exactly_once, after which the broker aborts an open transaction (at most the broker's transaction.max.timeout.ms); a transaction commits by a quarter of it, and kafka.transaction_interval must be under that", f, s)
	f, s = str(&c.Kafka.OffsetsTopic, "walrelay.offsets")
	add("kafka.offsets_topic", "compacted one-partition topic of the committed positions of kafka.exactly_once, keyed by slot; created if missing (16 MiB segments)", f, s)
	f, s = boolean(&c.Kafka.TLS.Enabled, false)
	add("kafka.tls.enabled", "connect to the brokers over TLS (on by itself when a kafka.tls file is set)", f, s)
	f, s = str(&c.Kafka.TLS.CAFile, "")
	add("kafka.tls.ca_file", "PEM file of the CAs that sign the brokers' certificates; default the system's", f, s)
	f, s = str(&c.Kafka.TLS.CertFile, "")
	add("kafka.tls.cert_file", "PEM client certificate, for brokers that require one (with kafka.tls.key_file)", f, s)
	f, s = str(&c.Kafka.TLS.KeyFile, "")
	add("kafka.tls.key_file", "PEM key of kafka.tls.cert_file", f, s)
	f, s = str(&c.Kafka.TLS.ServerName, "")
	add("kafka.tls.server_name", "name to verify the brokers' certificates against; default each broker's host", f, s)
	f, s = str(&c.Kafka.SASL.Mechanism, "")
	add("kafka.sasl.mechanism", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty for no SASL", f, s)
	f, s = str(&c.Kafka.SASL.Username, "")
	add("kafka.sasl.username", "SASL user", f, s)
	f, s = str(&c.Kafka.SASL.Password, "")
	add("kafka.sasl.password", "SASL password (prefer kafka.sasl.password_file or the environment)", f, s).redact = redactSecret
	f, s = str(&c.Kafka.SASL.PasswordFile, "")
	add("kafka.sasl.password_file", "file holding the SASL password", f, s)

	f, s = duration(&c.Poll.Interval, time.Second)
	add("poll.interval", "source poll: the longest wait between polls when no insert notification comes (LISTEN wakes the poller at once)", f, s)
	f, s = integer(&c.Poll.BatchSize, 1000)
	add("poll.batch_size", "source poll: rows claimed per table at once", f, s)
	f, s = duration(&c.Poll.Lease, 30*time.Second)
	add("poll.lease", "source poll: how long a claim holds its rows (renewed while Kafka has not answered); a worker gone this long has its rows claimed by another", f, s)
	f, s = integer(&c.Poll.MaxAttempts, 20)
	add("poll.max_attempts", "source poll: claims of a row before it goes to the dead-letter topic and DEAD (it waits 2^min(attempts, 10) s plus jitter after each failure)", f, s)
	f, s = str(&c.Poll.Ordering, "aggregate")
	add("poll.ordering", "source poll: aggregate (a row is not claimed while an earlier row of its aggregate is unsent) or none", f, s)
	f, s = str(&c.Poll.OnDead, "skip")
	add("poll.on_dead", "source poll, ordering aggregate: skip (later rows of a DEAD row's aggregate go on) or block (they wait until walrelay poll retry)", f, s)
	f, s = str(&c.Poll.WorkerID, "")
	add("poll.worker_id", "source poll: this instance's name in claim_id; empty: host-pid", f, s)

	f, s = str(&c.Admin.Listen, "127.0.0.1:8087")
	add("admin.listen", "address of the admin HTTP listener (/healthz, /readyz, /metrics, /status); empty turns it off", f, s)
	f, s = boolean(&c.Admin.Pprof, false)
	add("admin.pprof", "also serve Go's profiles under /debug/pprof on the admin listener", f, s)
	f, s = duration(&c.Heartbeat.Interval, 0)
	add("heartbeat.interval", "write a heartbeat message to the WAL this often, so the slot advances when only other databases write; 0 turns it off", f, s)
	f, s = str(&c.Log.Level, "info")
	add("log.level", "debug, info, warn or error", f, s)
	f, s = str(&c.Log.Format, "text")
	add("log.format", "text or json", f, s)
	f, s = duration(&c.Log.ProgressInterval, time.Minute)
	add("log.progress_interval", "how often a progress line (events/s, in flight, the slot's lag and retained WAL) is logged at info level, every tenth time only while idle; 0 for none", f, s)
	f, s = duration(&c.ShutdownTimeout, 20*time.Second)
	add("shutdown_timeout", "how long a stop waits for the open transaction and in-flight events; keep it some seconds under the grace period before SIGKILL (Kubernetes: 30s by default)", f, s)
	f, s = integer(&c.MemoryLimit, 0)
	add("memory_limit", "soft memory limit of the Go runtime in bytes; 0: 2 x kafka.max_buffered_bytes + 16 MiB (48 MiB with the default buffers); GOMEMLIMIT wins if set (GOMEMLIMIT=off turns it off)", f, s)
	return ks
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
	if c.Kafka.ExpandJSONPayload && (c.Kafka.ValueFormat == "" || c.Kafka.ValueFormat == string(sink.FormatRaw)) {
		return errors.New("kafka.expand_json_payload needs kafka.value_format json or json_schema (raw writes the payload as stored)")
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
	if _, _, err := c.Table(); err != nil {
		return err
	}
	if err := c.checkTables(); err != nil {
		return err
	}
	k := c.Kafka
	if k.CloudEvents != "" && k.CloudEvents != "binary" {
		return fmt.Errorf("kafka.cloudevents %q: want binary, or empty for none", k.CloudEvents)
	}
	if err := sink.CheckRouting(k.Topic, k.TopicRegex); err != nil {
		return fmt.Errorf("kafka.topic, kafka.topic_regex: %w", err)
	}
	switch {
	case k.BatchMaxBytes < 1024:
		return fmt.Errorf("kafka.batch_max_bytes %d: want at least 1024", k.BatchMaxBytes)
	case k.MaxBufferedRecords < 2:
		return fmt.Errorf("kafka.max_buffered_records %d: want at least 2 (half in flight, half queued)", k.MaxBufferedRecords)
	case k.MaxBufferedBytes < k.BatchMaxBytes:
		return fmt.Errorf("kafka.max_buffered_bytes %d is below kafka.batch_max_bytes %d: a large record could never be buffered", k.MaxBufferedBytes, k.BatchMaxBytes)
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
