package config

import (
	"strings"
)

// debeziumIgnored are options that do not change what walrelay must do,
// by prefix (a trailing dot) or by name, with why.
var debeziumIgnored = []struct{ option, why string }{
	{"name", "the connector's name in Kafka Connect"},
	{"tasks.max", "a Kafka Connect setting (the PostgreSQL connector runs one task)"},
	{"topic.prefix", "names Debezium's own topics (the table's change topic before routing, heartbeats); the outbox events are routed by route.topic.replacement"},
	{"database.server.name", "names Debezium's own topics (older versions of topic.prefix)"},
	{"snapshot.mode", "walrelay does not snapshot: it relays what the slot captures, as snapshot.mode=never does, which is what an outbox needs (old events are not sent again)"},
	{"snapshot.", "walrelay does not snapshot"},
	{"slot.drop.on.stop", "walrelay never drops its slot"},
	{"slot.max.retries", "walrelay retries without limit, with backoff"},
	{"slot.retry.delay.ms", "walrelay retries with its own backoff"},
	{"status.update.interval.ms", "postgres.status_interval (default 1s) plays this part"},
	{"heartbeat.action.query", "walrelay's heartbeat writes a logical decoding message itself (heartbeat.interval)"},
	{"heartbeat.topics.prefix", "walrelay writes no heartbeat topic"},
	{"tombstones.on.delete", "walrelay's publication publishes inserts only: deleting an outbox row sends nothing"},
	{"decimal.handling.mode", "the payload is relayed as stored, not converted column by column"},
	{"time.precision.mode", "the payload is relayed as stored"},
	{"binary.handling.mode", "the payload is relayed as stored"},
	{"hstore.handling.mode", "the payload is relayed as stored"},
	{"interval.handling.mode", "the payload is relayed as stored"},
	{"include.unknown.datatypes", "the payload is relayed as stored"},
	{"max.batch.size", "batching is walrelay's own (kafka.linger, kafka.batch_max_bytes)"},
	{"max.queue.size", "buffering is walrelay's own (kafka.max_buffered_records)"},
	{"max.queue.size.in.bytes", "buffering is walrelay's own (kafka.max_buffered_bytes)"},
	{"poll.interval.ms", "walrelay streams without polling"},
	{"provide.transaction.metadata", "walrelay writes no transaction topic; each record carries walrelay.lsn and walrelay.xid"},
	{"errors.", "Kafka Connect's error handling: walrelay dead-letters an event it cannot publish (kafka.dlq_topic) and never skips one"},
	{"offset.", "walrelay keeps its position in the slot"},
	{"producer.override.", "producer tuning: walrelay's kafka.* keys set its producer"},
	{"database.history.", "schema history is not used by the PostgreSQL connector"},
	{"schema.history.internal.", "schema history is not used by the PostgreSQL connector"},
	{"database.tcpKeepAlive", "walrelay's connections keep themselves alive"},
	{"database.initial.statements", "walrelay's sessions set their own parameters"},
	{"skipped.operations", "walrelay's publication publishes inserts only"},
	{"event.processing.failure.handling.mode", "walrelay dead-letters an event it cannot publish, or stops"},
	{"key.converter.schemas.enable", "read with key.converter"},
	{"value.converter.schemas.enable", "read with value.converter"},
	{"group.id", "a Kafka Connect worker setting"},
	{"config.storage.", "a Kafka Connect worker setting"},
	{"status.storage.", "a Kafka Connect worker setting"},
	{"plugin.path", "a Kafka Connect worker setting"},
	{"rest.", "a Kafka Connect worker setting"},
	{"listeners", "a Kafka Connect worker setting"},
	{"internal.", "a Kafka Connect worker setting"},
	{"offset.flush.interval.ms", "walrelay confirms positions itself (postgres.status_interval)"},
	{"transforms.", "read with transforms"},
	{"database.password", "not copied: give it in postgres.password_file, or in WALRELAY_POSTGRES_DSN"},
	{"database.sslpassword", "not copied: give it in WALRELAY_POSTGRES_DSN"},
	{"security.protocol", "read with bootstrap.servers"},
	{"sasl.jaas.config", "read with sasl.mechanism (the password is not copied)"},
}

func ignoredWhy(option string) (string, bool) {
	for _, ig := range debeziumIgnored {
		if ig.option == option || strings.HasSuffix(ig.option, ".") && strings.HasPrefix(option, ig.option) {
			return ig.why, true
		}
	}
	return "", false
}
