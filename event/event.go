// Package event holds the outbox event: what the decoder makes of a row of
// the outbox (or a logical message) and what the sink publishes, so that
// neither imports the other.
package event

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// Header is one Kafka header taken from a configured extra column.
type Header struct {
	Key   string
	Value []byte
}

// HeaderAggregateVersion is the header of the aggregate's version, in
// decimal, that an event of a table with a version column
// (outbox.version_column) carries.
const HeaderAggregateVersion = "walrelay.aggregate_version"

// Event is one outbox row (or logical message) of a committed transaction.
type Event struct {
	ID            string
	AggregateType string
	AggregateID   string
	Type          string
	Payload       []byte // nil: tombstone
	// PayloadText is true when the payload column is of a text type, not
	// json or jsonb, and PayloadBytes when it is bytea: the JSON formats
	// write each as Kafka Connect's JsonConverter writes its type.
	PayloadText, PayloadBytes bool
	// PayloadRequired is true when the payload column is NOT NULL: the
	// json_schema format then marks the value's schema required
	// (optional false), as Debezium does.
	PayloadRequired bool
	// AggregateIDType is the aggregate id column's type OID (0 for a
	// logical message: text), and AggregateIDNullable says that the column
	// is not NOT NULL: the avro key format writes the key in the column's
	// own schema, as Debezium's EventRouter does.
	AggregateIDType     uint32
	AggregateIDNullable bool
	// PayloadColumn is the payload column's name: the name of the schema
	// inferred for an expanded JSON payload, as Debezium names it.
	PayloadColumn string
	Headers       []Header // configured extra columns, in configured order
	// Partition is the value of the row's partition column when
	// HasPartition (a column configured, its value not NULL): the Kafka
	// partition to produce to instead of the key's.
	Partition    int32
	HasPartition bool
	// Time is the value of the row's timestamp column, if one is configured
	// and the value is not NULL: the Kafka record's timestamp.
	Time time.Time

	Source     string        // "schema.table", or "message" for a logical message
	WALStart   pglogrepl.LSN // position of the change itself
	Xid        uint32
	CommitLSN  pglogrepl.LSN // from Begin's FinalLSN: known before the rows arrive
	CommitTime time.Time
	// Index is the event's ordinal within its transaction, from 0: with
	// CommitLSN, its Position in the stream.
	Index int

	// Transactional is false only for a logical message emitted with
	// transactional=false: it arrives outside any Begin/Commit.
	Transactional bool
	// Invalid is non-nil when the row breaks a rule of its own (a required
	// column NULL, a value that does not parse). The sink dead-letters such an
	// event with this error instead of publishing it; one that wraps
	// ErrTooLarge with reason too_large.
	Invalid error
	// OmittedBytes is, for an event too large to hold (Invalid wraps
	// ErrTooLarge), the size of the payload left out: Payload is nil.
	OmittedBytes int64
}

// ErrTooLarge is wrapped by the Invalid error of an event whose message was
// over the size walrelay holds in memory (postgres.max_message_bytes): it
// was read as it arrived and dropped, and only what identifies it was kept.
var ErrTooLarge = errors.New("event too large")

// ErrBeforePrivileges is wrapped by the Invalid error of a logical
// decoding message event from a transaction older than the point from
// which only the outbox's writers could emit messages (the horizon walrelay
// migrate records): any role may have written it, so it is dead-lettered
// with reason message_before_privileges, never published.
var ErrBeforePrivileges = errors.New("message from a transaction before the privileges of pg_logical_emit_message were secured")

// Position is where an event is in the stream: its transaction's commit LSN
// and its ordinal within the transaction. The server streams transactions in
// commit order, so positions grow along the stream.
type Position struct {
	CommitLSN pglogrepl.LSN
	Index     int
}

// Position returns e's position in the stream.
func (e *Event) Position() Position { return Position{e.CommitLSN, e.Index} }

// After reports whether p comes after q in the stream.
func (p Position) After(q Position) bool {
	return p.CommitLSN > q.CommitLSN || p.CommitLSN == q.CommitLSN && p.Index > q.Index
}

func (p Position) String() string { return fmt.Sprintf("%s#%d", p.CommitLSN, p.Index) }

// WALHistory identifies the WAL a replication session streams: the
// server's system identifier, its timeline and flushed WAL position at the
// session's start, and where each earlier timeline of its history ended
// (its TIMELINE_HISTORY). WAL before the end of an earlier timeline is the
// same on both; after it, the same LSNs hold other transactions.
type WALHistory struct {
	SystemID string
	Timeline int32
	Flushed  pglogrepl.LSN
	// Ends maps each earlier timeline of the history to the LSN at which
	// the next one began.
	Ends map[int32]pglogrepl.LSN
}

func (h WALHistory) String() string {
	return fmt.Sprintf("system %s timeline %d", h.SystemID, h.Timeline)
}
