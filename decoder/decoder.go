package decoder

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/sqlquote"
)

// ErrMissingColumn is wrapped by the *Error returned when the outbox table's
// Relation message lacks a required column.
var ErrMissingColumn = errors.New("required column missing")

// ErrUnexpectedRelation is wrapped by the *Error returned for a row of a
// table that is not the outbox: the publication publishes a table walrelay
// does not read, which may be a partition of the outbox whose rows would
// otherwise pass unpublished.
var ErrUnexpectedRelation = errors.New("the publication publishes a table that is not the outbox")

// Error is a message the decoder cannot turn into events without risking a
// lost event; the pipeline must stop (its kind is failure.Fatal).
type Error struct {
	WALStart pglogrepl.LSN // position of the XLogData that carried the message
	MsgType  byte          // the pgoutput message type byte, 0 when empty
	Err      error
}

func (e *Error) Error() string {
	if e.MsgType == 0 {
		return fmt.Sprintf("decode pgoutput message at %s: %v", e.WALStart, e.Err)
	}
	return fmt.Sprintf("decode pgoutput %q message at %s: %v", e.MsgType, e.WALStart, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// FailureKind is failure.Fatal: skipping the message could lose events.
func (e *Error) FailureKind() failure.Kind { return failure.Fatal }

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

// Config configures a Decoder. Zero values mean the defaults.
type Config struct {
	// Layout is the outbox table (the first, when there are several).
	Layout
	// More are further outbox tables read from the same stream, each with
	// its own layout; their Table must be set.
	More []Layout
	// Messages turns the logical decoding messages under MessagePrefix into
	// events (the outbox without a table, walrelay_emit). Default false:
	// they are ignored (Ignored kind "message_source_off"), because
	// PostgreSQL lets every role call pg_logical_emit_message unless its
	// EXECUTE is revoked from PUBLIC; whoever turns it on must see that
	// only the outbox's writers may (relay.CheckMessagePrivileges).
	Messages bool
	// MessagePrefix is the logical decoding message prefix whose messages
	// become events (with Messages). Default "walrelay". Messages with the
	// prefix MessagePrefix+".heartbeat" are ignored as heartbeats.
	MessagePrefix string
	// IgnoredPrefixes are prefixes of other programs' logical decoding
	// messages, expected: ignored as kind "message_ignored_prefix". A
	// message under any other prefix is ignored too, as kind
	// "message_foreign_prefix", which the relay logs once per prefix.
	IgnoredPrefixes []string
	// MessagesFrom is, with Messages, the full transaction id (xid8) from
	// which messages under MessagePrefix are trusted: every transaction
	// that began before only the outbox's writers could execute
	// pg_logical_emit_message has an older one (walrelay migrate records
	// it: migrations.MessageHorizon). A message from an older transaction
	// is an event whose Invalid wraps event.ErrBeforePrivileges, which the
	// sink dead-letters. Zero trusts every transaction.
	MessagesFrom uint64
	// XidNow is a recent full transaction id of the server (the relay
	// reads it at start), from which the 32-bit xids of the stream are
	// widened to compare them with MessagesFrom across xid wraparound.
	// Zero means MessagesFrom.
	XidNow uint64
}

// Layouts returns every outbox table of cfg, the first first, defaults
// filled in.
func (cfg Config) Layouts() []Layout {
	ls := make([]Layout, 0, 1+len(cfg.More))
	for _, l := range append([]Layout{cfg.Layout}, cfg.More...) {
		ls = append(ls, l.WithDefaults())
	}
	return ls
}

// Message is what one pgoutput message decodes to: Begin, Commit,
// EventMessage or Ignored.
type Message interface{ isMessage() }

// Begin starts a transaction. Its FinalLSN is the LSN of the commit record,
// known before the rows arrive.
type Begin struct {
	FinalLSN   pglogrepl.LSN
	Xid        uint32
	CommitTime time.Time
}

// Commit ends the transaction begun last. EndLSN (TransactionEndLSN) is the
// position to confirm once every event of the transaction is acknowledged:
// confirming CommitLSN would make the server send the transaction again.
type Commit struct {
	CommitLSN  pglogrepl.LSN
	EndLSN     pglogrepl.LSN
	CommitTime time.Time
}

// Ignored is a message that yields no event. Kind names it for counting:
// "relation", "type", "origin", "update", "delete", "truncate",
// "heartbeat", "message_ignored_prefix" (a prefix of IgnoredPrefixes),
// "message_foreign_prefix" (any other prefix walrelay does not read),
// "message_source_off" (under MessagePrefix, with Messages off).
type Ignored struct {
	Kind string
	// Prefix is the prefix of an ignored logical decoding message, but a
	// heartbeat's; empty for other kinds. Any role can choose it: bound
	// what is kept of it.
	Prefix string
}

// EventMessage carries an outbox event: a row of the outbox, or a logical
// message under the read prefix.
type EventMessage struct{ *event.Event }

func (Begin) isMessage() {}

func (Commit) isMessage() {}

func (EventMessage) isMessage() {}

func (Ignored) isMessage() {}

// Decoder decodes one replication stream. It is not safe for concurrent use.
type Decoder struct {
	cfg       Config
	layouts   []Layout // cfg.Layouts()
	heartbeat string
	ignored   map[string]bool // IgnoredPrefixes
	rels      map[uint32]*relation
	txn       Begin
	index     int // events of the open transaction so far
	inTxn     bool
	txnXid    uint64       // the open transaction's full xid (widen)
	lastXid   uint64       // the newest full xid widened so far
	vals      []tupleValue // reused by each insert
	scratch   []byte       // reused by each insert
}

type relation struct {
	name       string // schema.table as the Relation message gave it
	outbox     bool
	source     string // the outbox table's configured schema.table: Event.Source
	cols       []*pglogrepl.RelationMessageColumn
	id         int // column indexes of the required columns
	aggType    int
	aggID      int
	typ        int
	payload    int
	headers    []int
	headerKeys []string // the Kafka header of each of headers
	part       int      // the partition column's index, or -1
	stamp      int      // the timestamp column's index, or -1
	trace      int      // the trace column's index, or -1
	// payloadText and payloadBytes say whether the payload column is of a
	// text type or bytea (Event.PayloadText, PayloadBytes).
	payloadText, payloadBytes bool
	payloadRequired           bool // the layout's PayloadNotNull
	aggIDNullable             bool // the layout's AggregateIDNullable
}

// WithDefaults returns cfg with its empty fields set to the defaults.
func (cfg Config) WithDefaults() Config {
	cfg.Layout = cfg.Layout.WithDefaults()
	if cfg.MessagePrefix == "" {
		cfg.MessagePrefix = "walrelay"
	}
	return cfg
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
		{"order column", l.OrderColumn}, {"trace column", l.TraceColumn}} {
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

// Validate checks cfg's tables and header columns, as New does; the
// configuration calls it whatever the source, so that the poll source
// refuses what the relay would.
func (cfg Config) Validate() error {
	cfg = cfg.WithDefaults()
	tables := map[string]bool{}
	for i, l := range cfg.More {
		if l.Table == "" {
			return fmt.Errorf("outbox table %d: no table name", i+2)
		}
	}
	for _, l := range cfg.Layouts() {
		if err := l.CheckNames(); err != nil {
			return err
		}
		if tables[l.Name()] {
			return fmt.Errorf("outbox table %s: listed twice", l.Name())
		}
		tables[l.Name()] = true
		seen, named := map[string]bool{}, map[string]string{}
		for _, h := range l.HeaderColumns {
			if h == "" || seen[h] {
				return fmt.Errorf("header column %q of %s: empty or listed twice", h, l.Name())
			}
			seen[h] = true
			name := l.HeaderName(h)
			if other, ok := named[name]; ok || name == "" {
				return fmt.Errorf("header column %q of %s: its header %q is empty or also that of column %q", h, l.Name(), name, other)
			}
			if why := reservedHeader(l, name); why != "" {
				return fmt.Errorf("header column %q of %s: its header %q is reserved (%s): name it otherwise (column:name)", h, l.Name(), name, why)
			}
			named[name] = h
		}
		for c := range l.HeaderNames {
			if !seen[c] {
				return fmt.Errorf("header name of column %q of %s: not a header column", c, l.Name())
			}
		}
	}
	return nil
}

// New returns a Decoder for cfg, with defaults filled in.
func New(cfg Config) (*Decoder, error) {
	cfg = cfg.WithDefaults()
	ignored := map[string]bool{}
	for _, p := range cfg.IgnoredPrefixes {
		if p == cfg.MessagePrefix {
			return nil, fmt.Errorf("message prefix %q is both read and ignored", p)
		}
		ignored[p] = true
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	layouts := cfg.Layouts()
	return &Decoder{
		cfg:       cfg,
		layouts:   layouts,
		heartbeat: cfg.MessagePrefix + ".heartbeat",
		ignored:   ignored,
		rels:      map[uint32]*relation{},
		lastXid:   cmp.Or(cfg.XidNow, cfg.MessagesFrom),
	}, nil
}

// widen is the full transaction id (epoch and xid) of the 32-bit xid x,
// taken as the one nearest to the full id last: the stream's transactions
// are all within 2^31 of each other and of the server's next xid
// (PostgreSQL's wraparound protection, which the slot's catalog_xmin holds
// back), as TransactionIdPrecedes assumes.
func widen(last uint64, x uint32) uint64 {
	f := int64(last) + int64(int32(x-uint32(last)))
	if f < 0 {
		return uint64(x)
	}
	return uint64(f)
}

// Reset forgets the relation cache and any open transaction. Call it before
// a new stream starts: the server sends Relation messages again.
func (d *Decoder) Reset() {
	clear(d.rels)
	d.inTxn = false
}

// Decode decodes one pgoutput message that arrived in XLogData at walStart.
// Errors are *Error.
func (d *Decoder) Decode(walStart pglogrepl.LSN, data []byte) (msg Message, err error) {
	if len(data) == 0 {
		return nil, &Error{WALStart: walStart, Err: errors.New("empty message")}
	}
	typ := data[0]
	switch typ {
	case 'I':
		// Inserts, the hot path, are read here: pglogrepl copies each value
		// byte by byte and trusts the length fields of the tuple.
		msg, err = d.insert(walStart, data)
		if err != nil {
			return nil, &Error{WALStart: walStart, MsgType: typ, Err: err}
		}
		return msg, nil
	case 'U':
		return Ignored{Kind: "update"}, nil
	case 'D':
		return Ignored{Kind: "delete"}, nil
	}
	if typ == 'T' && len(data) >= 5 {
		// pglogrepl allocates the relation list before it reads it; a
		// corrupt count must not become a multi-gigabyte allocation.
		if n := binary.BigEndian.Uint32(data[1:5]); uint64(len(data)) < 6+4*uint64(n) {
			return nil, &Error{WALStart: walStart, MsgType: typ, Err: fmt.Errorf("truncate of %d relations in %d bytes", n, len(data))}
		}
	}
	m, err := parse(data)
	if err != nil {
		return nil, &Error{WALStart: walStart, MsgType: typ, Err: err}
	}
	msg, err = d.decode(walStart, m)
	if err != nil {
		return nil, &Error{WALStart: walStart, MsgType: typ, Err: err}
	}
	return msg, nil
}

// parse is pglogrepl.Parse, which indexes without bounds checks: this is the
// one place that turns its panic into an error.
func parse(data []byte) (m pglogrepl.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("malformed message: %v", r)
		}
	}()
	return pglogrepl.Parse(data)
}

func (d *Decoder) decode(walStart pglogrepl.LSN, m pglogrepl.Message) (Message, error) {
	switch m := m.(type) {
	case *pglogrepl.BeginMessage:
		if d.inTxn {
			return nil, fmt.Errorf("begin of xid %d inside xid %d", m.Xid, d.txn.Xid)
		}
		d.txn = Begin{FinalLSN: m.FinalLSN, Xid: m.Xid, CommitTime: m.CommitTime.UTC()}
		d.txnXid = widen(d.lastXid, m.Xid)
		d.lastXid = max(d.lastXid, d.txnXid)
		d.inTxn = true
		d.index = 0
		return d.txn, nil
	case *pglogrepl.CommitMessage:
		if !d.inTxn {
			return nil, fmt.Errorf("commit at %s outside a transaction", m.CommitLSN)
		}
		d.inTxn = false
		return Commit{CommitLSN: m.CommitLSN, EndLSN: m.TransactionEndLSN, CommitTime: m.CommitTime.UTC()}, nil
	case *pglogrepl.RelationMessage:
		return Ignored{Kind: "relation"}, d.relation(m)
	case *pglogrepl.LogicalDecodingMessage:
		return d.message(walStart, m)
	case *pglogrepl.TruncateMessage:
		return Ignored{Kind: "truncate"}, nil
	case *pglogrepl.TypeMessage:
		return Ignored{Kind: "type"}, nil
	case *pglogrepl.OriginMessage:
		return Ignored{Kind: "origin"}, nil
	default:
		return nil, fmt.Errorf("unexpected message type %s", m.Type())
	}
}

func (d *Decoder) relation(m *pglogrepl.RelationMessage) error {
	r := &relation{name: m.Namespace + "." + m.RelationName, cols: m.Columns}
	l := d.layoutOf(m)
	if l == nil {
		// Not an error yet: publishing via the root, pgoutput describes
		// the partition too before a row of it, which it then sends as
		// the root's. A row of this relation is the error (insert).
		d.rels[m.RelationID] = r
		return nil
	}
	r.outbox = true
	r.source = l.Name()
	r.payloadRequired = l.PayloadNotNull
	r.aggIDNullable = l.AggregateIDNullable
	index := func(name string) (int, error) {
		for i, c := range m.Columns {
			if c.Name == name {
				return i, nil
			}
		}
		return -1, fmt.Errorf("table %s has no column %q: %w", r.source, name, ErrMissingColumn)
	}
	c := l.Columns
	var err error
	for _, f := range []struct {
		p    *int
		name string
	}{{&r.id, c.ID}, {&r.aggType, c.AggregateType}, {&r.aggID, c.AggregateID}, {&r.typ, c.Type}, {&r.payload, c.Payload}} {
		if *f.p, err = index(f.name); err != nil {
			return err
		}
	}
	for _, h := range l.HeaderColumns {
		i, err := index(h)
		if err != nil {
			return err
		}
		r.headers = append(r.headers, i)
		r.headerKeys = append(r.headerKeys, l.HeaderName(h))
	}
	switch m.Columns[r.payload].DataType {
	case oidText, oidVarchar, oidBpchar:
		r.payloadText = true
	case oidBytea:
		r.payloadBytes = true
	}
	r.part, r.stamp, r.trace = -1, -1, -1
	if name := l.TraceColumn; name != "" {
		if r.trace, err = index(name); err != nil {
			return err
		}
		if t := m.Columns[r.trace].DataType; t != oidText && t != oidVarchar && t != oidBpchar {
			return fmt.Errorf("the trace column %q of %s is of type oid %d: it must be text or varchar", name, r.source, t)
		}
	}
	if name := l.PartitionColumn; name != "" {
		if r.part, err = index(name); err != nil {
			return err
		}
		if t := m.Columns[r.part].DataType; t != oidInt2 && t != oidInt4 && t != oidInt8 {
			return fmt.Errorf("the partition column %q of %s is of type oid %d: it must be smallint, integer or bigint", name, r.source, t)
		}
	}
	if name := l.TimestampColumn; name != "" {
		if r.stamp, err = index(name); err != nil {
			return err
		}
		if t := m.Columns[r.stamp].DataType; t != oidTimestamp && t != oidTimestamptz && t != oidDate {
			return fmt.Errorf("the timestamp column %q of %s is of type oid %d: it must be timestamp, timestamptz or date", name, r.source, t)
		}
	}
	d.rels[m.RelationID] = r
	return nil
}

// layoutOf returns the layout of the outbox table m describes, nil when m
// is of another table. The id wins over the name: a table renamed keeps its
// id, and another table may have taken its name.
func (d *Decoder) layoutOf(m *pglogrepl.RelationMessage) *Layout {
	for i := range d.layouts {
		if l := &d.layouts[i]; l.RelationID != 0 && l.RelationID == m.RelationID {
			return l
		}
	}
	for i := range d.layouts {
		if l := &d.layouts[i]; l.Schema == m.Namespace && l.Table == m.RelationName {
			return l
		}
	}
	return nil
}

func (d *Decoder) newEvent(walStart pglogrepl.LSN, source string) *event.Event {
	d.index++
	return &event.Event{
		Index:         d.index - 1,
		Source:        source,
		WALStart:      walStart,
		Xid:           d.txn.Xid,
		CommitLSN:     d.txn.FinalLSN,
		CommitTime:    d.txn.CommitTime,
		Transactional: true,
	}
}

// names lists the outbox tables, for an error.
func (d *Decoder) names() string {
	names := make([]string, len(d.layouts))
	for i, l := range d.layouts {
		names[i] = l.Name()
	}
	return strings.Join(names, ", ")
}
