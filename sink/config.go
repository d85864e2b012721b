package sink

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/schemafirst"
	"github.com/walrelay/walrelay/sink/record"
)

// Config configures a Sink. Zero values mean the defaults.
type Config struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// ClientID is the Kafka client id. Default "walrelay".
	ClientID string
	// Topic is the topic template: {aggregatetype} and {type} are replaced
	// by the event's values. Default "outbox.event.{aggregatetype}". With
	// TopicRegex it is the replacement instead.
	Topic string
	// TopicRegex, if set, routes as Debezium's route.topic.regex: an
	// aggregate type that the expression (Go's RE2 syntax) matches whole
	// goes to Topic with the expression's groups replaced as Java replaces
	// them ($1, ${name}); one that does not match goes to the topic of its
	// own name.
	TopicRegex string
	// Routes route the events of some outbox tables otherwise, by their
	// table (Event.Source, schema.table); the rest go by Topic and
	// TopicRegex.
	Routes map[string]record.Route
	// AllowedTopics, if set, confines the topics that events may be routed
	// to, whatever the routing and the row say: a topic must equal an
	// entry, or start with an entry that ends in * (a prefix, the * left
	// out). An event routed elsewhere is dead-lettered
	// (ReasonForbiddenTopic). Empty: any topic but the reserved ones.
	AllowedTopics []string
	// ReservedTopics are topics of walrelay's own besides DLQTopic and the
	// offsets topic of Transactions (an offsets topic configured for
	// another time, say). No event is routed to a reserved topic, to
	// walrelay's default topic names (walrelay.dlq, walrelay.offsets,
	// walrelay.inbox.dlq) or to a topic named as Kafka's internal ones are
	// (__…), whatever AllowedTopics says: it is dead-lettered
	// (ReasonForbiddenTopic).
	ReservedTopics []string
	// TombstoneOnEmpty makes a NULL or blank payload a tombstone (a null
	// value) in every format, as Debezium's route.tombstone.on.empty.payload.
	TombstoneOnEmpty bool
	// CloudEvents, if "binary", adds the CloudEvents attributes as headers
	// of the Kafka protocol binding's binary mode: ce_specversion, ce_id,
	// ce_source (CloudEventsSource), ce_type, ce_subject (the aggregate
	// id), ce_time (the event's Time, else its commit time) and
	// content-type (application/json); the value stays the payload. An
	// event without a type is dead-lettered (a CloudEvent must have one).
	CloudEvents string
	// OmitHeaders are headers of record.OptionalHeaders that records (and dead
	// letters) do not carry, for consumers that expect exactly another
	// connector's headers (Debezium's EventRouter sends only id). The
	// event id header, id, is always sent: consumers deduplicate on it.
	// Default: every one is sent.
	OmitHeaders []string
	// CloudEventsSource is ce_source, a URI reference, in which {table} is
	// replaced by the event's table (Event.Source). Required with
	// CloudEvents.
	CloudEventsSource string
	// PlacedPartitions lets an event carry its own partition
	// (Event.HasPartition); the others go by their key. An event whose
	// partition its topic lacks is dead-lettered (invalid_partition).
	PlacedPartitions bool
	// DLQTopic receives events that cannot be published. Default
	// "walrelay.dlq".
	DLQTopic string
	// Compression is none, gzip, snappy, lz4 or zstd. Default lz4.
	Compression string
	// KeyFormat and ValueFormat are how the key (the aggregate id) and the
	// value (the payload) are written (package record): FormatRaw (the
	// default, as Kafka Connect's StringConverter), or as its JsonConverter
	// (FormatJSON, FormatJSONSchema), or in a schema registry's format
	// (FormatAvro, with Avro). Dead letters keep the raw form.
	KeyFormat, ValueFormat record.Format
	// Avro writes the keys and values of record.FormatAvro (package
	// format), its schemas registered in a schema registry; required by
	// record.FormatAvro.
	Avro *format.AvroEncoder
	// Passthrough checks the values of record.FormatRegistryPassthrough
	// against a schema registry; required by it.
	Passthrough *format.Passthrough
	// SchemaFirst writes the values of the schema-first formats
	// (record.FormatRegisteredAvro, …); required by them.
	SchemaFirst *schemafirst.Encoder
	// ExpandJSONPayload writes a json or text payload that is a JSON object
	// or array as that JSON value in the JSON formats, with its inferred
	// schema in FormatJSONSchema, as Debezium's table.expand.json.payload
	// does, instead of a string of its text.
	ExpandJSONPayload bool
	// RequestTimeout bounds how long the sink waits for a broker's answer
	// before it gives the request up and sends it again: half of it the
	// broker's own wait for the in-sync replicas, half the network's.
	// Default 10s. A leader that the cluster fenced is left sooner, whatever
	// this is (produce.Fences); a broker slower than it is retried (idempotence
	// keeps each record once).
	RequestTimeout time.Duration
	// Linger is how long the sink, with nothing in flight, waits for more
	// records before it sends what it has. Default 5ms; negative sends at
	// once.
	Linger time.Duration
	// BatchMaxBytes caps one record batch; a record larger than this is
	// dead-lettered. Default 1000012, Kafka's default max.message.bytes. A
	// topic whose max.message.bytes (or the broker's message.max.bytes) is
	// lower gets that lower cap: the broker would refuse a whole batch over
	// it, small records and all.
	BatchMaxBytes int32
	// MaxBufferedRecords and MaxBufferedBytes bound what is published and
	// not yet acknowledged: half for the records in flight, half for those
	// queued behind them; Publish blocks beyond them. Defaults 5000 and
	// 16 MiB. A single record larger than half is let in alone. In
	// exactly-once mode an event is acknowledged when its Kafka
	// transaction commits: the open transaction's records, sent or
	// acknowledged by Kafka, count with those in flight until it ends.
	MaxBufferedRecords int
	MaxBufferedBytes   int
	// DisableAutoCreateTopics stops the client from asking the broker to
	// create missing topics. By default it asks (the broker must allow it).
	DisableAutoCreateTopics bool
	// Logger receives lifecycle logs and the client's warnings. Nil discards.
	Logger *slog.Logger
	// Tracer, if set, records spans for the events that carry a trace
	// context (a traceparent header, from outbox.trace_column); package
	// tracing makes one. Nil (the default) costs a nil check per event.
	Tracer Tracer
	// Opts are extra client options (TLS, SASL), applied last to every
	// client the sink makes; ProducerOpts (hooks) to the producer alone.
	// Hooks given in Opts (kgo.WithHooks) are set on the producer alone,
	// as those of ProducerOpts are, and see the broker and produce events
	// of the sink's other clients (one per broker, the exactly-once offsets
	// reader and fencer) but not their creation: a hook that registers
	// metrics when it sees a client created, as kprom does, registers them
	// once. Such a hook also sees one short-lived client created and
	// closed while New looks for the hooks in Opts.
	Opts, ProducerOpts []kgo.Opt
	// Transactions, if set, produces exactly once, in Kafka transactions
	// fenced by the source position (package txn).
	Transactions *Transactions
}

// defaults fills the defaults of the brokers, the client id, the formats
// and the topics, and checks them.
func (cfg *Config) defaults() error {
	if len(cfg.Brokers) == 0 {
		return errors.New("kafka brokers: none configured")
	}
	if err := CheckBrokers(cfg.Brokers); err != nil {
		return fmt.Errorf("kafka brokers: %w", err)
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "walrelay"
	}
	if cfg.KeyFormat == "" {
		cfg.KeyFormat = record.FormatRaw
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	if cfg.ValueFormat == "" {
		cfg.ValueFormat = record.FormatRaw
	}
	if (cfg.KeyFormat == record.FormatAvro || cfg.ValueFormat == record.FormatAvro) && cfg.Avro == nil {
		return errors.New("format avro: no schema registry configured")
	}
	if cfg.KeyFormat == record.FormatRegistryPassthrough {
		return errors.New("format registry_passthrough: values only")
	}
	if cfg.ValueFormat == record.FormatRegistryPassthrough && cfg.Passthrough == nil {
		return errors.New("format registry_passthrough: no schema registry configured")
	}
	if _, ok := cfg.ValueFormat.SchemaFirst(); ok && cfg.SchemaFirst == nil {
		return fmt.Errorf("format %s: no schema registry configured", cfg.ValueFormat)
	}
	if _, ok := cfg.KeyFormat.SchemaFirst(); ok {
		return fmt.Errorf("key format %s: the schema-first formats are for values", cfg.KeyFormat)
	}
	if cfg.Topic == "" {
		cfg.Topic = "outbox.event.{aggregatetype}"
	}
	if cfg.DLQTopic == "" {
		cfg.DLQTopic = "walrelay.dlq"
	}
	if !record.ValidTopic(cfg.DLQTopic) {
		return fmt.Errorf("dead-letter topic %q is not a valid Kafka topic name", cfg.DLQTopic)
	}
	if cfg.Transactions != nil && cfg.Transactions.OffsetsTopic == "" {
		cfg.Transactions.OffsetsTopic = "walrelay.offsets" // its default, reserved below
	}
	return nil
}

// bufferDefaults fills the defaults of the rounds and the buffers, and
// checks them.
func (cfg *Config) bufferDefaults() error {
	if cfg.Linger == 0 {
		cfg.Linger = 5 * time.Millisecond
	}
	if cfg.BatchMaxBytes == 0 {
		cfg.BatchMaxBytes = 1000012
	}
	if cfg.MaxBufferedRecords == 0 {
		cfg.MaxBufferedRecords = 5000
	}
	if cfg.MaxBufferedBytes == 0 {
		cfg.MaxBufferedBytes = 16 << 20
	}
	if int64(cfg.MaxBufferedBytes) < int64(cfg.BatchMaxBytes) {
		return fmt.Errorf("max buffered bytes %d is below batch max bytes %d: a large record could never be buffered", cfg.MaxBufferedBytes, cfg.BatchMaxBytes)
	}
	return nil
}

// recordConfig is what of cfg package record follows.
func recordConfig(cfg Config) record.Config {
	rc := record.Config{
		Topic: cfg.Topic, TopicRegex: cfg.TopicRegex, Routes: cfg.Routes,
		AllowedTopics: cfg.AllowedTopics, DLQTopic: cfg.DLQTopic, ReservedTopics: cfg.ReservedTopics,
		TombstoneOnEmpty: cfg.TombstoneOnEmpty, CloudEvents: cfg.CloudEvents, CloudEventsSource: cfg.CloudEventsSource,
		OmitHeaders: cfg.OmitHeaders, KeyFormat: cfg.KeyFormat, ValueFormat: cfg.ValueFormat, ExpandJSONPayload: cfg.ExpandJSONPayload,
	}
	if cfg.Transactions != nil {
		rc.OffsetsTopic = cfg.Transactions.OffsetsTopic
	}
	return rc
}

// compression returns the client option for a codec name.
func compression(name string) (kgo.Opt, error) {
	switch name {
	case "", "lz4":
		return kgo.WithCompressor(newLz4Compressor()), nil
	case "none":
		return kgo.ProducerBatchCompression(kgo.NoCompression()), nil
	case "gzip":
		return kgo.ProducerBatchCompression(kgo.GzipCompression()), nil
	case "snappy":
		return kgo.ProducerBatchCompression(kgo.SnappyCompression()), nil
	case "zstd":
		return kgo.ProducerBatchCompression(kgo.ZstdCompression()), nil
	}
	return nil, fmt.Errorf("compression %q: want none, gzip, snappy, lz4 or zstd", name)
}
