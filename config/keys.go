package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/walrelay/walrelay/sink/record"
)

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
	add("source", "where events come from: `wal`, a logical replication slot; `poll`, the outbox table polled, for databases without logical replication (see Without logical replication (docs/poll.md))", f, s)
	dsn, dsnShow := str(&c.Postgres.DSN, "")
	add("postgres.dsn", "connection string of the database with the outbox; shown only as parsed and rebuilt without its password (a URL's password with `@ # / ? % :` or a space percent-encoded; one that does not parse is refused at start)", dsn, dsnShow).redact = RedactDSN
	f, s = str(&c.Postgres.Slot, "walrelay")
	add("postgres.slot", "logical replication slot", f, s)
	f, s = str(&c.Postgres.Publication, "walrelay_outbox")
	add("postgres.publication", "publication of the outbox table", f, s)
	f, s = str(&c.Postgres.Table, "public.outbox")
	add("postgres.table", "the outbox table, `schema.table` (with several, list them in `outbox.tables` instead)", f, s)
	f, s = boolean(&c.Postgres.CreateSlot, true)
	add("postgres.create_slot", "create the publication and the slot at start if missing (never a slot walrelay created that is gone: `walrelay slot create`)", f, s)
	f, s = boolean(&c.Postgres.SlotFailover, false)
	add("postgres.slot_failover", "mark the slot for failover at start (PostgreSQL 17+): a physical standby with `sync_replication_slots = on` keeps a copy it can use once promoted (see Database failover (docs/failover.md))", f, s)
	f, s = boolean(&c.Postgres.AllowRowFilter, false)
	add("postgres.allow_row_filter", "accept a row filter on the outbox in the publication: for a shard of a sharded outbox only (the rows it leaves out are not published)", f, s)
	f, s = duration(&c.Postgres.StatusInterval, time.Second)
	add("postgres.status_interval", "longest time between standby status updates (10ms to 30s)", f, s)
	f, s = duration(&c.Postgres.ReceiveTimeout, 30*time.Second)
	add("postgres.receive_timeout", "reconnect when nothing, not even a keepalive, arrived from the server for this long (a dead host or route sends no FIN); halfway through walrelay asks the server for a reply; at least 4 status intervals", f, s)
	f, s = integer(&c.Postgres.MaxMessageBytes, 0)
	add("postgres.max_message_bytes", "the largest event walrelay holds in memory, in bytes (at least 65536): a larger outbox row or logical message is read as it arrives and dropped, and dead-lettered (`too_large`) without its payload, with its size (`walrelay.payload_omitted_bytes`), its position and the id, key and type that fit in its first 64 KiB; the poll source and `replay`, `reconcile` and `dlq replay` measure every column of a row in their query (its text) and dead-letter a row larger than this without reading its columns (but its id, aggregate type and id, and type, each when at most 1 KiB). An event under it may be held about three times over (as received, decoded and as a record): keep it well under the memory limit", f, s)
	f, s = str(&c.Postgres.PasswordFile, "")
	add("postgres.password_file", "file holding the PostgreSQL password (a final newline is dropped), used where the DSN has none; a password in the DSN as well is an error", f, s)

	f, s = str(&c.Outbox.IDColumn, "id")
	add("outbox.id_column", "column of the event id", f, s)
	f, s = str(&c.Outbox.AggregateTypeColumn, "aggregatetype")
	add("outbox.aggregate_type_column", "column that routes the topic", f, s)
	f, s = str(&c.Outbox.AggregateIDColumn, "aggregateid")
	add("outbox.aggregate_id_column", "column of the key", f, s)
	f, s = str(&c.Outbox.TypeColumn, "type")
	add("outbox.type_column", "column of the `type` header", f, s)
	f, s = str(&c.Outbox.PayloadColumn, "payload")
	add("outbox.payload_column", "column of the value", f, s)
	f, s = list(&c.Outbox.HeaderColumns, nil)
	add("outbox.header_columns", "extra columns copied into headers, comma-separated; `column:name` names the header otherwise; a header named like one walrelay writes (`id`, `type`, `walrelay.*`, `content-type`, the CloudEvents `ce_*` ones, `traceparent`/`tracestate` with `outbox.trace_column` or `tracing.enabled`; any case) is refused", f, s)
	f, s = boolean(&c.Outbox.Messages, false)
	add("outbox.messages", "publish the logical decoding messages under `outbox.message_prefix` as events (the outbox without a table: `walrelay_emit`); off, they are ignored and `walrelay_emit` inserts a row. On, `check` and `run` refuse to start while a role without `INSERT` on the outbox table (PUBLIC by default) may execute `pg_logical_emit_message`, and `migrate` revokes it (docs/outbox.md: Who can write events)", f, s)
	f, s = str(&c.Outbox.MessagePrefix, "walrelay")
	add("outbox.message_prefix", "prefix of logical decoding messages published as events with `outbox.messages` (`<prefix>.heartbeat` is ignored)", f, s)
	f, s = list(&c.Outbox.IgnorePrefixes, nil)
	add("outbox.ignore_message_prefixes", "prefixes of other programs' logical decoding messages, ignored without a log line; a message under any other prefix walrelay does not read is ignored too, logged once per prefix; both are counted in `walrelay_changes_ignored_total`", f, s)
	f, s = str(&c.Outbox.TimestampColumn, "")
	add("outbox.timestamp_column", "a `timestamp`, `timestamptz` or `date` column (Debezium's `table.field.event.timestamp`; without a zone it is UTC): the Kafka record's timestamp (NULL: the time of publishing), and the time windows of `replay`, `reconcile` and `prune` (empty: the time in UUIDv7 ids)", f, s)
	f, s = str(&c.Outbox.OrderColumn, "")
	add("outbox.order_column", "a column whose order is the rows' insert order (an identity or a sequence; `migrate` creates it as `bigint GENERATED BY DEFAULT AS IDENTITY`): the order in which `replay` and `reconcile --replay` send rows (empty: see Replay order (docs/operations.md))", f, s)
	f, s = str(&c.Outbox.TraceColumn, "")
	add("outbox.trace_column", "a text column holding the writer's trace context, a W3C `traceparent` or the `java.util.Properties` text of Debezium's `tracingspancontext` column: it becomes the `traceparent` and `tracestate` headers, so a consumer's span continues the writer's trace (with `tracing.enabled`, walrelay's publish span in between, see docs/tracing.md; a value without a valid `traceparent` gives no header, a later version's is passed on as its 55 characters in version `00`'s form, and a `tracestate` that is not W3C's, or over 32 members or 512 bytes, gives no `tracestate` header)", f, s)
	f, s = str(&c.Outbox.VersionColumn, "")
	add("outbox.version_column", "a `smallint`, `integer` or `bigint` column holding the aggregate's version: published as the header `walrelay.aggregate_version` (decimal), by which a consumer handles an aggregate's events in version order (package inbox's `VersionOrder`, see docs/outbox.md); a NULL version is dead-lettered (`invalid_event`), never published without it", f, s)
	f, s = tables(&c.Outbox.Tables)
	add("outbox.tables", "several outbox tables on one slot and one publication (see Several outbox tables (docs/outbox.md)): a YAML list of entries with `table` (`schema.table`, required) and any of `id_column`, `aggregate_type_column`, `aggregate_id_column`, `type_column`, `payload_column`, `header_columns`, `timestamp_column`, `order_column`, `partition_column`, `trace_column`, `version_column`, `topic`, `topic_regex`; an entry's empty key takes the top-level key of that name (`header_columns: []` gives none); in the environment or a flag, the list's JSON; `postgres.table` set as well is an error", f, s).structured = true
	f, s = str(&c.Outbox.PartitionColumn, "")
	add("outbox.partition_column", "a `smallint`, `integer` or `bigint` column whose value is the record's Kafka partition (Debezium's `…:partition` placement); NULL: the key's partition; a negative value, or a partition the topic lacks, is dead-lettered (`invalid_event`, `invalid_partition`)", f, s)

	f, s = list(&c.Kafka.Brokers, nil)
	add("kafka.brokers", "seed brokers, comma-separated, each `host:port` (one with credentials, `user:password@host:port` or `token@host`, or a URL is refused: SASL credentials go in `kafka.sasl.*`)", f, s)
	f, s = str(&c.Kafka.Topic, "outbox.event.{aggregatetype}")
	add("kafka.topic", "topic template; `{aggregatetype}` and `{type}` are replaced; with `kafka.topic_regex`, the replacement of its groups", f, s)
	f, s = str(&c.Kafka.TopicRegex, "")
	add("kafka.topic_regex", "Debezium's `route.topic.regex` (Go's RE2 syntax, `(?<name>…)` groups): a routing value it matches whole goes to `kafka.topic` with `$1` and `${name}` replaced as Java replaces them (`\\` escapes); a value it does not match is itself the topic, as in Debezium", f, s)
	f, s = list(&c.Kafka.AllowedTopics, nil)
	add("kafka.allowed_topics", "topics events may go to, comma-separated: a name, or a prefix ending in `*` (`orders.*`); an event whose route (`kafka.topic`, `kafka.topic_regex`, an `outbox.tables` entry's) gives another topic is dead-lettered (reason `forbidden_topic`); empty: any topic. Whatever it says, no event goes to walrelay's own topics (`kafka.dlq_topic`, `kafka.offsets_topic`, `walrelay.dlq`, `walrelay.offsets`, `walrelay.inbox.dlq`) or to one named `__…`. Set it when a route lets the row choose the start of the topic (a regex, or a template that starts with `{aggregatetype}` or `{type}`): walrelay warns at start and `check` warns otherwise", f, s)
	f, s = boolean(&c.Kafka.TombstoneOnEmpty, false)
	add("kafka.tombstone_on_empty_payload", "Debezium's `route.tombstone.on.empty.payload`: a NULL or blank payload gives a tombstone (a null value) in every value format", f, s)
	f, s = str(&c.Kafka.KeyFormat, "raw")
	add("kafka.key_format", "the key as Kafka Connect's converters write it: `raw` (StringConverter), `json` or `json_schema` (JsonConverter with `schemas.enable` false or true), or `avro` (Apicurio's AvroConverter with `as-confluent=true`, `use-id=contentId`, `headers.enabled=false`: Avro in Confluent's wire format, its schema in `kafka.schema_registry.url`, see docs/schema-registry.md), as Debezium's outbox records carry it", f, s)
	f, s = str(&c.Kafka.ValueFormat, "raw")
	add("kafka.value_format", "the value likewise; the JSON formats write a NULL payload as JSON `null` (no tombstone), as the JsonConverter does. Or `registry_passthrough` (values only): a payload that the application already serialized and framed in Confluent's wire format (Debezium's Avro recipe, a `bytea` payload) is published untouched once its framing is checked and its schema id found in `kafka.schema_registry.url`, a version of the value's subject (`<topic>-value` unless `kafka.schema_registry.subject_strategy` says otherwise), else dead-lettered (`format`, `schema_unknown`). Or a schema-first format (values only): the payload is JSON that the application wrote, written in the schema registered for its event in `kafka.schema_registry.url` (`kafka.schema_registry.subject_strategy`), in Confluent's wire format: `registered_avro` (Avro), `registered_protobuf` (Protobuf, after Confluent's message indexes) or `registered_jsonschema` (the JSON itself, valid in the JSON Schema); a payload that does not fit is dead-lettered (`schema_mismatch`, the field in `walrelay.error`); see Schema-first (docs/schema-registry.md)", f, s)
	f, s = boolean(&c.Kafka.ExpandJSONPayload, false)
	add("kafka.expand_json_payload", "with `kafka.value_format` `json`, `json_schema` or `avro`: a `json`, `jsonb` or text payload whose text starts with `{` or `[` and parses is written as that JSON value (`json_schema`: in the envelope with the schema Debezium infers, named by the payload column; `avro`: a record of that schema; fields that are null or empty arrays left out), as Debezium's `table.expand.json.payload`; a payload Debezium would leave a string (not an object or array, an array of mixed types or number kinds, an array of nulls only) stays one; with `raw`, an error", f, s)
	f, s = str(&c.Kafka.CloudEvents, "")
	add("kafka.cloudevents", "`binary`: each record carries the CloudEvents attributes as headers of the Kafka protocol binding's binary mode (`ce_specversion` `1.0`, `ce_id`, `ce_source`, `ce_type`, `ce_subject` the aggregate id, `ce_time` the timestamp column's time or else the commit time, `content-type` `application/json`, or `application/octet-stream` for a `bytea` payload); the value stays the payload, and the `id` and `type` headers stay; an event without a type is dead-lettered (`invalid_event`)", f, s)
	f, s = str(&c.Kafka.CloudEventsSource, "")
	add("kafka.cloudevents_source", "`ce_source` of `kafka.cloudevents`, in which `{table}` is replaced by the event's `schema.table` (`message` for `walrelay_emit`); empty: `/<database>/{table}`", f, s)
	f, s = list(&c.Kafka.Headers, record.OptionalHeaders[:])
	add("kafka.headers", "the headers each record (and dead letter) carries besides `id`, comma-separated, of `type`, `walrelay.lsn`, `walrelay.xid` and `walrelay.commit_time` (the commit LSN, transaction id and commit time of its transaction); empty (`[]`): none, `id` alone as Debezium's EventRouter sends it. The event id header `id` is always sent, since consumers (package `inbox`, `reconcile`) deduplicate and match on it. Without `type`, package `inbox` hands the handler an empty `Message.Type`; header columns and CloudEvents headers are sent either way", f, s)
	f, s = str(&c.Kafka.DLQTopic, "walrelay.dlq")
	add("kafka.dlq_topic", "dead-letter topic", f, s)
	f, s = str(&c.Kafka.ClientID, "walrelay")
	add("kafka.client_id", "Kafka client id", f, s)
	f, s = str(&c.Kafka.Compression, "lz4")
	add("kafka.compression", "`none`, `gzip`, `snappy`, `lz4` or `zstd`", f, s)
	f, s = duration(&c.Kafka.Linger, 5*time.Millisecond)
	add("kafka.linger", "how long walrelay, with nothing in flight to Kafka, waits for more records before it sends; `0` sends at once", f, s)
	f, s = integer(&c.Kafka.BatchMaxBytes, 1000012)
	add("kafka.batch_max_bytes", "largest record batch (at least 1024), lowered for a topic whose `max.message.bytes` (read from the broker) is smaller; a larger record is dead-lettered; a produce request holds at most this and 64 KiB (about one batch: the client's encoding buffer stays that small)", f, s)
	f, s = integer(&c.Kafka.MaxBufferedRecords, 5000)
	add("kafka.max_buffered_records", "records published and not yet acknowledged, at most (at least 2): half in flight, half queued behind them (backpressure); in exactly-once mode a record is acknowledged when its Kafka transaction commits, and the open transaction's records count with those in flight", f, s)
	f, s = integer(&c.Kafka.MaxBufferedBytes, 16<<20)
	add("kafka.max_buffered_bytes", "bytes published and not yet acknowledged, at most (at least `kafka.batch_max_bytes`), split the same way; one record larger than half is let in alone (backpressure)", f, s)
	f, s = boolean(&c.Kafka.AutoCreateTopics, true)
	add("kafka.auto_create_topics", "ask the broker to create missing topics", f, s)
	f, s = boolean(&c.Kafka.ExactlyOnce, false)
	add("kafka.exactly_once", "produce in Kafka transactions fenced by the source position: a consumer reading with `isolation.level=read_committed` sees each event once, across crashes (see Exactly once (docs/exactly-once.md))", f, s)
	f, s = str(&c.Kafka.TransactionalID, "")
	add("kafka.transactional_id", "transactional id of exactly-once mode; empty: `walrelay-<system identifier>-<database>-<slot>`, stable across restarts and failovers to a physical standby; shared by every instance of a slot, and by no other slot: two slots given one id are refused (\"another walrelay instance, of another slot, uses the same transactional id\")", f, s)
	f, s = str(&c.Kafka.TakeoverID, "")
	add("kafka.transactional_id_takeover", "transactional id whose committed position of the slot this relay takes over, fencing it (after a change of `kafka.transactional_id`, or of the database's system identifier by `pg_upgrade`: docs/upgrading.md); empty: a position committed under another id than `kafka.transactional_id` is refused", f, s)
	f, s = integer(&c.Kafka.AcceptTimeline, 0)
	add("kafka.accept_timeline", "timeline of the database onto which exactly-once carries a committed position that lies past the end of its own timeline (after a failover or restore that lost WAL, once reconciled): this timeline's events from the switch on are published; `0`: refused", f, s)
	f, s = duration(&c.Kafka.TransactionInterval, 10*time.Millisecond)
	add("kafka.transaction_interval", "longest a Kafka transaction stays open once it holds an event: consumers see nothing of it before the commit", f, s)
	f, s = duration(&c.Kafka.RequestTimeout, 10*time.Second)
	add("kafka.request_timeout", "how long walrelay waits for a broker's answer before it gives the request up and sends it again (half is the broker's own wait for its in-sync replicas; each record is kept once by idempotence). It does not set how soon a silent leader is left: walrelay asks the other brokers while it waits, and leaves a silent leader as soon as the cluster has fenced it. Keep it above your brokers' slowest healthy answer: a lower value sends a slow broker's requests again, for nothing (see A Kafka cluster (docs/failover.md))", f, s)
	f, s = duration(&c.Kafka.RefusalStopAfter, 2*time.Minute)
	add("kafka.refusal_stop_after", "how long the brokers must refuse the same event with an error no healthy cluster answers with for long (`POLICY_VIOLATION`, `UNSUPPORTED_COMPRESSION_TYPE`), and in five sessions in a row, before walrelay stops and says what to fix; the events are held meanwhile. Errors a healthy cluster answers with for a while (Kafka's retriable codes, `UNKNOWN_SERVER_ERROR`, timeouts, a coordinator that moves, throttling) never stop walrelay (docs/guarantees.md)", f, s)
	f, s = duration(&c.Kafka.TransactionTimeout, time.Minute)
	add("kafka.transaction_timeout", "transaction timeout of exactly-once mode, after which the broker aborts an open transaction (at most the broker's `transaction.max.timeout.ms`); a transaction commits by a quarter of it, and `kafka.transaction_interval` must be under that", f, s)
	f, s = str(&c.Kafka.OffsetsTopic, "walrelay.offsets")
	add("kafka.offsets_topic", "compacted one-partition topic of the committed positions, keyed by slot; created if missing (16 MiB segments)", f, s)
	f, s = boolean(&c.Kafka.TLS.Enabled, false)
	add("kafka.tls.enabled", "connect to the brokers over TLS; on by itself when any `kafka.tls` file or name below is set", f, s)
	f, s = str(&c.Kafka.TLS.CAFile, "")
	add("kafka.tls.ca_file", "PEM file of the CAs that sign the brokers' certificates; certificates are always verified", f, s)
	f, s = str(&c.Kafka.TLS.CertFile, "")
	add("kafka.tls.cert_file", "PEM client certificate and key, for brokers that require one (both or neither)", f, s)
	f, s = str(&c.Kafka.TLS.KeyFile, "")
	add("kafka.tls.key_file", "PEM client certificate and key, for brokers that require one (both or neither)", f, s)
	f, s = str(&c.Kafka.TLS.ServerName, "")
	add("kafka.tls.server_name", "name the brokers' certificates are verified against", f, s)
	f, s = str(&c.Kafka.SASL.Mechanism, "")
	add("kafka.sasl.mechanism", "`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`", f, s)
	f, s = str(&c.Kafka.SASL.Username, "")
	add("kafka.sasl.username", "SASL user", f, s)
	f, s = str(&c.Kafka.SASL.Password, "")
	add("kafka.sasl.password", "SASL password; redacted in the start-up log and scrubbed from errors", f, s).redact = redactSecret
	f, s = str(&c.Kafka.SASL.PasswordFile, "")
	add("kafka.sasl.password_file", "file holding the SASL password instead (both set is an error)", f, s)
	f, s = str(&c.Kafka.SchemaRegistry.URL, "")
	add("kafka.schema_registry.url", "the schema registry of the `avro` and `registry_passthrough` formats and the schema-first ones (`registered_avro`, `registered_protobuf`, `registered_jsonschema`), through Confluent's Schema Registry API (Apicurio Registry: `http://host:8080/apis/ccompat/v7`), `http` or `https` (the system's CAs, or `kafka.schema_registry.tls_ca_file`'s), without credentials (`user:password@` or `token@` is refused, and so is a query or fragment, `?access_token=…`: they go in `kafka.schema_registry.username` and `kafka.schema_registry.password_file`, or a client certificate in `kafka.schema_registry.tls_cert_file`); Debezium's `…converter.apicurio.registry.url` or `…converter.schema.registry.url` (see Schema registry formats (docs/schema-registry.md))", f, s)
	f, s = str(&c.Kafka.SchemaRegistry.Username, "")
	add("kafka.schema_registry.username", "HTTP basic auth user of the schema registry", f, s)
	f, s = str(&c.Kafka.SchemaRegistry.Password, "")
	add("kafka.schema_registry.password", "its password; redacted in the start-up log and scrubbed from errors", f, s).redact = redactSecret
	f, s = str(&c.Kafka.SchemaRegistry.PasswordFile, "")
	add("kafka.schema_registry.password_file", "file holding the schema registry's password instead (both set is an error)", f, s)
	f, s = boolean(&c.Kafka.SchemaRegistry.AutoRegister, false)
	add("kafka.schema_registry.auto_register", "the `avro` format: register a schema that its subject (`<topic>-key`, `<topic>-value`) does not have yet, as Debezium's `…auto-register=true`; `false`: such an event is dead-lettered (`schema_refused`). The schema-first formats: register the schema files that `kafka.schema_registry.subjects` names (`subject=path`), at start and never otherwise; `false`: walrelay registers nothing", f, s)
	f, s = str(&c.Kafka.SchemaRegistry.IDKind, "contentId")
	add("kafka.schema_registry.id_kind", "the schema id in the records' framing: `contentId`, the id that Confluent's API gives (Apicurio's content id, Debezium's `…use-id=contentId`); Apicurio's `globalId` is not supported", f, s)
	f, s = str(&c.Kafka.SchemaRegistry.TLSCAFile, "")
	add("kafka.schema_registry.tls_ca_file", "PEM file of the CAs that the `https` schema registry's certificate is verified against, instead of the system's", f, s)
	f, s = str(&c.Kafka.SchemaRegistry.TLSCertFile, "")
	add("kafka.schema_registry.tls_cert_file", "PEM client certificate for a schema registry that asks for one (mutual TLS), with `kafka.schema_registry.tls_key_file`", f, s)
	f, s = str(&c.Kafka.SchemaRegistry.TLSKeyFile, "")
	add("kafka.schema_registry.tls_key_file", "PEM private key of `kafka.schema_registry.tls_cert_file`", f, s)
	f, s = duration(&c.Kafka.SchemaRegistry.Timeout, 10*time.Second)
	add("kafka.schema_registry.timeout", "how long one request to the schema registry may take; a registry that does not answer holds the events (retried as when Kafka is down)", f, s)
	schemaFirstKeys(c, add)

	f, s = duration(&c.Poll.Interval, time.Second)
	add("poll.interval", "`source: poll`: the longest wait between claims when no insert notification comes (`LISTEN` wakes the poller at once)", f, s)
	f, s = integer(&c.Poll.BatchSize, 1000)
	add("poll.batch_size", "`source: poll`: rows claimed per table at once", f, s)
	f, s = duration(&c.Poll.Lease, 30*time.Second)
	add("poll.lease", "`source: poll`: how long a claim holds its rows (at least 1s; renewed every third of it while Kafka has not answered); the rows of an instance gone this long are claimed by another", f, s)
	f, s = integer(&c.Poll.MaxAttempts, 20)
	add("poll.max_attempts", "`source: poll`: claims of a row before it goes to the dead-letter topic (reason `max_attempts`) and `DEAD`; after each failure it waits `2^min(attempts, 10)` s plus jitter", f, s)
	f, s = str(&c.Poll.Ordering, "aggregate")
	add("poll.ordering", "`source: poll`: `aggregate` (a row is not claimed while an earlier row of its aggregate is unsent) or `none`", f, s)
	f, s = str(&c.Poll.OnDead, "skip")
	add("poll.on_dead", "`source: poll` with `poll.ordering: aggregate`: `skip` (the later rows of a `DEAD` row's aggregate go on) or `block` (they wait until `walrelay poll retry`)", f, s)
	f, s = str(&c.Poll.WorkerID, "")
	add("poll.worker_id", "`source: poll`: this instance's name in `claim_id` (which adds a random token of each start, so ids need not be unique)", f, s)

	f, s = str(&c.Admin.Listen, "127.0.0.1:8087")
	add("admin.listen", "admin HTTP listener (`/healthz`, `/readyz`, `/metrics`, `/status`); empty turns it off", f, s)
	f, s = boolean(&c.Admin.Pprof, false)
	add("admin.pprof", "also serve Go's profiles under `/debug/pprof` on the admin listener (`?seconds=` at most 30; without authentication: `run` and `check` warn when the listener is not on loopback)", f, s)
	f, s = duration(&c.Heartbeat.Interval, 0)
	add("heartbeat.interval", "write a heartbeat message into the WAL this often", f, s)
	f, s = boolean(&c.Tracing.Enabled, false)
	add("tracing.enabled", "record OpenTelemetry spans (the WAL wait and the publish) for each event with a trace context (`outbox.trace_column`), exported by OTLP as the standard `OTEL_*` variables say (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_SERVICE_NAME` (default `walrelay`), `OTEL_TRACES_SAMPLER`, ...): see docs/tracing.md", f, s)
	f, s = boolean(&c.Tracing.RootSpans, false)
	add("tracing.root_spans", "with `tracing.enabled`, start a new trace (walrelay's publish span as its root, sampled by `OTEL_TRACES_SAMPLER`) for each event without a trace context, and send its `traceparent` with the record; by default such an event starts no trace", f, s)
	f, s = str(&c.Log.Level, "info")
	add("log.level", "`debug`, `info`, `warn` or `error`", f, s)
	f, s = str(&c.Log.Format, "text")
	add("log.format", "`text` or `json`", f, s)
	f, s = duration(&c.Log.ProgressInterval, time.Minute)
	add("log.progress_interval", "how often a progress line (events/s, in flight, the slot's lag and retained WAL) is logged at info level, every tenth time only while idle; `0s` for none", f, s)
	f, s = duration(&c.ShutdownTimeout, 20*time.Second)
	add("shutdown_timeout", "how long a stop waits for the open transaction and in-flight events; keep it some seconds under the grace period before SIGKILL (Kubernetes: 30 s), so that the last status update goes out", f, s)
	f, s = integer(&c.MemoryLimit, 0)
	add("memory_limit", "soft memory limit of the Go runtime in bytes; it follows the buffers, which hold most of what walrelay keeps; the binary's code (about 27 MiB resident) comes on top of it, so with the default the process stays under 64 MiB; `GOMEMLIMIT` wins if set (`GOMEMLIMIT=off` turns it off)", f, s)
	return ks
}
