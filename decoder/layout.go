package decoder

import (
	"fmt"
	"slices"
	"strings"

	"github.com/walrelay/walrelay/internal/sqlquote"
)

// Columns names the outbox table's columns. Empty fields take the Debezium
// outbox layout: id, aggregatetype, aggregateid, type, payload.
type Columns struct {
	ID            string // event id; Kafka header "id". Default "id".
	AggregateType string // routes the topic. Default "aggregatetype".
	AggregateID   string // Kafka key. Default "aggregateid".
	Type          string // Kafka header "type". Default "type".
	Payload       string // Kafka value; NULL gives a tombstone. Default "payload".
}

// Layout is one outbox table and how its columns map onto an event. Zero
// values mean the defaults.
type Layout struct {
	// Schema and Table name the outbox table. Default public.outbox.
	Schema, Table string
	// RelationID is the outbox table's OID, if known. A Relation message is
	// the outbox's when its id is RelationID or its name is Schema.Table
	// (the id follows a rename; the name, a table dropped and created
	// again). A partitioned outbox must be published via its root
	// (publish_via_partition_root), whose id and name its rows then carry.
	RelationID uint32
	// Columns names the required columns.
	Columns Columns
	// PayloadNotNull says that the payload column is NOT NULL (the relay
	// reads it from the catalog at start; a Relation message does not
	// say): its events' PayloadRequired.
	PayloadNotNull bool
	// AggregateIDNullable says that the aggregate id column is not NOT
	// NULL (the relay reads it from the catalog at start): its events'
	// AggregateIDNullable. The zero value is NOT NULL, as walrelay migrate
	// creates the column.
	AggregateIDNullable bool
	// HeaderColumns are extra columns copied into Kafka headers named after
	// them (or as HeaderNames says). A listed column missing from the table
	// is an error.
	HeaderColumns []string
	// HeaderNames gives a header column's Kafka header another name than
	// the column's (Debezium's placement column:header:name), by column.
	HeaderNames map[string]string
	// PartitionColumn, if set, is an integer column whose value is the
	// Kafka partition of the row's record (Debezium's
	// table.fields.additional.placement …:partition); NULL leaves the
	// partition to the key.
	PartitionColumn string
	// TimestampColumn, if set, is a timestamp, timestamptz or date column
	// whose value is the Kafka record's timestamp (Debezium's
	// table.field.event.timestamp; a timestamp without zone is taken as
	// UTC); NULL leaves the time of publishing.
	TimestampColumn string
	// OrderColumn, if set, is a column whose order is the rows' insert
	// order (an identity or sequence, a clock_timestamp() default). The
	// decoder does not read it: it is the order in which package recovery
	// replays rows.
	OrderColumn string
	// TraceColumn, if set, is a text column holding the writer's trace
	// context: a W3C traceparent, or java.util.Properties text with
	// traceparent and tracestate keys (what Debezium's
	// tracing.span.context.field holds). It becomes the traceparent and
	// tracestate headers; a value without a valid traceparent gives none,
	// a later version's traceparent becomes its 55 characters in version
	// 00's form, and a tracestate that is not W3C's (more than 32
	// members, more than 512 bytes, a member of other characters) gives
	// no tracestate header.
	TraceColumn string
	// VersionColumn, if set, is a smallint, integer or bigint column
	// holding the aggregate's version: it becomes the header
	// walrelay.aggregate_version (event.HeaderAggregateVersion), in
	// decimal, by which a consumer (package inbox's Config.VersionOrder)
	// handles an aggregate's events in version order. A NULL version
	// makes the row's event Invalid: it is dead-lettered, never published
	// without its version.
	VersionColumn string
}

// HeaderName is the Kafka header of header column col: its HeaderNames
// entry, or its name.
func (l Layout) HeaderName(col string) string {
	if n, ok := l.HeaderNames[col]; ok {
		return n
	}
	return col
}

// Name is the table's schema.table: the Source of its events.
func (l Layout) Name() string { return l.Schema + "." + l.Table }

// WithDefaults returns l with its empty fields set to the defaults.
func (l Layout) WithDefaults() Layout {
	if l.Schema == "" {
		l.Schema = "public"
	}
	if l.Table == "" {
		l.Table = "outbox"
	}
	c := &l.Columns
	for _, f := range []struct {
		p   *string
		def string
	}{{&c.ID, "id"}, {&c.AggregateType, "aggregatetype"}, {&c.AggregateID, "aggregateid"}, {&c.Type, "type"}, {&c.Payload, "payload"}} {
		if *f.p == "" {
			*f.p = f.def
		}
	}
	return l
}

// ReservedHeaders are the Kafka headers walrelay writes on every record
// (and, with CloudEvents on, the ce_* ones and content-type): a header
// column published under one of these names, or under any name that
// starts with "walrelay.", is refused, since a consumer would read two
// values under one name (package inbox would take a correlation id for
// the event id). The comparison ignores case.
var ReservedHeaders = []string{"id", "type", "content-type",
	"ce_specversion", "ce_id", "ce_source", "ce_type", "ce_subject", "ce_time"}

// reservedHeader reports why header name is walrelay's, or "".
func reservedHeader(l Layout, name string) string {
	lower := strings.ToLower(name)
	switch {
	case slices.Contains(ReservedHeaders, lower):
		return "walrelay writes it"
	case strings.HasPrefix(lower, "walrelay."):
		return "the walrelay.* headers are walrelay's"
	case l.TraceColumn != "" && (lower == "traceparent" || lower == "tracestate"):
		return "the trace column " + l.TraceColumn + " writes it"
	}
	return ""
}

// CheckNames refuses a name of l that walrelay could not write into SQL
// as it is (sqlquote.CheckName: empty, not UTF-8, a control character or
// a '$', over 63 bytes), naming the setting it comes from: the schema,
// the table and every configured column. Empty fields take the defaults.
func (l Layout) CheckNames() error {
	l = l.WithDefaults()
	c := l.Columns
	names := []struct{ what, name string }{{"schema", l.Schema}, {"table", l.Table},
		{"id column", c.ID}, {"aggregate type column", c.AggregateType}, {"aggregate id column", c.AggregateID},
		{"type column", c.Type}, {"payload column", c.Payload}}
	for _, h := range l.HeaderColumns {
		if h != "" { // refused by Validate, as empty
			names = append(names, struct{ what, name string }{"header column", h})
		}
	}
	for _, x := range []struct{ what, name string }{{"partition column", l.PartitionColumn}, {"timestamp column", l.TimestampColumn},
		{"order column", l.OrderColumn}, {"trace column", l.TraceColumn}, {"version column", l.VersionColumn}} {
		if x.name != "" {
			names = append(names, x)
		}
	}
	for _, n := range names {
		if err := sqlquote.CheckName(n.name); err != nil {
			return fmt.Errorf("outbox table %q: %s: %w", l.Name(), n.what, err)
		}
	}
	return nil
}
