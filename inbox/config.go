package inbox

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"
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
	// DeadLetterTopic receives the records that failed MaxAttempts times
	// (reason handler_failed; claim_failed when the inbox's own claim of
	// the event failed and its handler never ran), those whose event id
	// cannot be read: no "id" header (reason
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
	// VersionOrder, if set, handles each aggregate's events (the records
	// of one topic and key) in the order of their versions: the
	// walrelay.aggregate_version header, a decimal integer, that walrelay
	// writes from outbox.version_column. The last version handled of each
	// aggregate is kept in the inbox's versions table (<Table>_versions,
	// made by Migrate and walrelay migrate --inbox), written in the
	// handler's transaction, so it moves exactly when the handler's
	// changes commit. An aggregate's first event (no version kept) is
	// handled whatever its version; after it, version n+1 is handled. A
	// version at or below the last one handled is stale: skipped, its id
	// kept as handled, counted (walrelay_inbox_version_stale_total). A
	// version above the next waits in memory, up to VersionWait, for the
	// versions before it (the partition's other records go on meanwhile;
	// its offset is not committed past the one waiting, so a restart
	// reads it again), then is dead-lettered with reason version_gap and
	// an error naming the aggregate and the versions expected and got.
	// A record with several such headers, or one not a decimal int64, is
	// dead-lettered at once (invalid_version). A record without the
	// header is handled as without VersionOrder, counted
	// (walrelay_inbox_version_missing_total) and logged once per partition
	// assignment: its aggregate's kept version does not move.
	VersionOrder bool
	// VersionWait bounds how long an event whose version is ahead of its
	// aggregate's next (VersionOrder) waits for the missing versions
	// before it is dead-lettered. Default 30s.
	VersionWait time.Duration
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

// DefaultVersionWait is Config.VersionWait's default.
const DefaultVersionWait = 30 * time.Second

// DefaultRetention is Config.Retention's default: 30 days, four times
// Kafka's default retention.ms.
const DefaultRetention = 30 * 24 * time.Hour
