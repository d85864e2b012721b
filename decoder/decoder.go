package decoder

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// ErrMissingColumn is wrapped by the *Error returned when the outbox table's
// Relation message lacks a required column.
var ErrMissingColumn = errors.New("required column missing")

// ErrUnexpectedRelation is wrapped by the *Error returned for a row of a
// table that is not the outbox: the publication publishes a table walrelay
// does not read, which may be a partition of the outbox whose rows would
// otherwise pass unpublished.
var ErrUnexpectedRelation = errors.New("the publication publishes a table that is not the outbox")

// ErrUnexpectedPrefix is wrapped by the *Error returned for a logical
// decoding message under a prefix that is neither read nor listed as
// ignored: it may be an outbox event emitted under another prefix.
var ErrUnexpectedPrefix = errors.New("logical decoding message under an unexpected prefix")

// Error is a message the decoder cannot turn into events without risking a
// lost event; the pipeline must stop.
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

// Columns names the outbox table's columns. Empty fields take the Debezium
// outbox layout: id, aggregatetype, aggregateid, type, payload.
type Columns struct {
	ID            string // event id; Kafka header "id". Default "id".
	AggregateType string // routes the topic. Default "aggregatetype".
	AggregateID   string // Kafka key. Default "aggregateid".
	Type          string // Kafka header "type". Default "type".
	Payload       string // Kafka value; NULL gives a tombstone. Default "payload".
}

// Config configures a Decoder. Zero values mean the defaults.
type Config struct {
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
	// HeaderColumns are extra columns copied into Kafka headers named after
	// them. A listed column missing from the table is an error.
	HeaderColumns []string
	// MessagePrefix is the logical decoding message prefix whose messages
	// become events. Default "walrelay". Messages with the prefix
	// MessagePrefix+".heartbeat" are ignored as heartbeats.
	MessagePrefix string
	// IgnoredPrefixes are prefixes of other programs' logical decoding
	// messages, ignored. A message under any other prefix is an error.
	IgnoredPrefixes []string
}

// Message is what one pgoutput message decodes to: Begin, Commit, *Event or
// Ignored.
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
// "heartbeat", "message_ignored_prefix".
type Ignored struct{ Kind string }

// Header is one Kafka header taken from a configured extra column.
type Header struct {
	Key   string
	Value []byte
}

// Event is one outbox row (or logical message) of a committed transaction.
type Event struct {
	ID            string
	AggregateType string
	AggregateID   string
	Type          string
	Payload       []byte   // nil: tombstone
	Headers       []Header // configured extra columns, in configured order

	Source     string        // "schema.table", or "message" for a logical message
	WALStart   pglogrepl.LSN // position of the change itself
	Xid        uint32
	CommitLSN  pglogrepl.LSN // from Begin's FinalLSN: known before the rows arrive
	CommitTime time.Time

	// Transactional is false only for a logical message emitted with
	// transactional=false: it arrives outside any Begin/Commit.
	Transactional bool
	// Invalid is non-nil when the row breaks a rule of its own (a required
	// column NULL, a value that does not parse). The sink dead-letters such an
	// event with this error instead of publishing it.
	Invalid error
}

func (Begin) isMessage()   {}
func (Commit) isMessage()  {}
func (*Event) isMessage()  {}
func (Ignored) isMessage() {}

// Decoder decodes one replication stream. It is not safe for concurrent use.
type Decoder struct {
	cfg       Config
	source    string
	heartbeat string
	ignored   map[string]bool // IgnoredPrefixes
	rels      map[uint32]*relation
	txn       Begin
	inTxn     bool
	vals      []tupleValue // reused by each insert
	scratch   []byte       // reused by each insert
}

type relation struct {
	name    string // schema.table as the Relation message gave it
	outbox  bool
	cols    []*pglogrepl.RelationMessageColumn
	id      int // column indexes of the required columns
	aggType int
	aggID   int
	typ     int
	payload int
	headers []int
}

// WithDefaults returns cfg with its empty fields set to the defaults.
func (cfg Config) WithDefaults() Config {
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	if cfg.Table == "" {
		cfg.Table = "outbox"
	}
	c := &cfg.Columns
	for _, f := range []struct {
		p   *string
		def string
	}{{&c.ID, "id"}, {&c.AggregateType, "aggregatetype"}, {&c.AggregateID, "aggregateid"}, {&c.Type, "type"}, {&c.Payload, "payload"}} {
		if *f.p == "" {
			*f.p = f.def
		}
	}
	if cfg.MessagePrefix == "" {
		cfg.MessagePrefix = "walrelay"
	}
	return cfg
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
	seen := map[string]bool{}
	for _, h := range cfg.HeaderColumns {
		if h == "" || seen[h] {
			return nil, fmt.Errorf("header column %q: empty or listed twice", h)
		}
		seen[h] = true
	}
	return &Decoder{
		cfg:       cfg,
		source:    cfg.Schema + "." + cfg.Table,
		heartbeat: cfg.MessagePrefix + ".heartbeat",
		ignored:   ignored,
		rels:      map[uint32]*relation{},
	}, nil
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
		d.inTxn = true
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
	if m.RelationID != d.cfg.RelationID && (m.Namespace != d.cfg.Schema || m.RelationName != d.cfg.Table) {
		// Not an error yet: publishing via the root, pgoutput describes
		// the partition too before a row of it, which it then sends as
		// the root's. A row of this relation is the error (insert).
		d.rels[m.RelationID] = r
		return nil
	}
	r.outbox = true
	index := func(name string) (int, error) {
		for i, c := range m.Columns {
			if c.Name == name {
				return i, nil
			}
		}
		return -1, fmt.Errorf("table %s has no column %q: %w", d.source, name, ErrMissingColumn)
	}
	c := d.cfg.Columns
	var err error
	for _, f := range []struct {
		p    *int
		name string
	}{{&r.id, c.ID}, {&r.aggType, c.AggregateType}, {&r.aggID, c.AggregateID}, {&r.typ, c.Type}, {&r.payload, c.Payload}} {
		if *f.p, err = index(f.name); err != nil {
			return err
		}
	}
	for _, h := range d.cfg.HeaderColumns {
		i, err := index(h)
		if err != nil {
			return err
		}
		r.headers = append(r.headers, i)
	}
	d.rels[m.RelationID] = r
	return nil
}

func (d *Decoder) newEvent(walStart pglogrepl.LSN, source string) *Event {
	return &Event{
		Source:        source,
		WALStart:      walStart,
		Xid:           d.txn.Xid,
		CommitLSN:     d.txn.FinalLSN,
		CommitTime:    d.txn.CommitTime,
		Transactional: true,
	}
}

// tupleValue is one column of a tuple: its kind byte ('n' NULL, 'u'
// unchanged TOAST, 't' text, 'b' binary) and, for text and binary, its bytes,
// which alias the message.
type tupleValue struct {
	kind byte
	data []byte
}

// parseInsert reads an Insert message: 'I', relation id, 'N', then TupleData.
// Every length is checked against the message.
func parseInsert(data []byte, vals []tupleValue) (uint32, []tupleValue, error) {
	if len(data) < 8 || data[5] != 'N' {
		return 0, nil, fmt.Errorf("insert of %d bytes without a new tuple", len(data))
	}
	rel := binary.BigEndian.Uint32(data[1:5])
	n := int(binary.BigEndian.Uint16(data[6:8]))
	p := 8
	for i := range n {
		if p >= len(data) {
			return 0, nil, fmt.Errorf("insert into relation %d: tuple ends before column %d of %d", rel, i+1, n)
		}
		v := tupleValue{kind: data[p]}
		p++
		switch v.kind {
		case 't', 'b':
			if len(data)-p < 4 {
				return 0, nil, fmt.Errorf("insert into relation %d: column %d has no length", rel, i+1)
			}
			l := binary.BigEndian.Uint32(data[p:])
			p += 4
			if uint64(len(data)-p) < uint64(l) {
				return 0, nil, fmt.Errorf("insert into relation %d: column %d of %d bytes overruns the message", rel, i+1, l)
			}
			v.data = data[p : p+int(l)]
			p += int(l)
		case 'n', 'u':
		default:
			return 0, nil, fmt.Errorf("insert into relation %d: column %d has unknown kind %q", rel, i+1, v.kind)
		}
		vals = append(vals, v)
	}
	if p != len(data) {
		return 0, nil, fmt.Errorf("insert into relation %d: %d bytes after the tuple", rel, len(data)-p)
	}
	return rel, vals, nil
}

func (d *Decoder) insert(walStart pglogrepl.LSN, data []byte) (Message, error) {
	rel, vals, err := parseInsert(data, d.vals[:0])
	if err != nil {
		return nil, err
	}
	d.vals = vals
	r, ok := d.rels[rel]
	if !ok {
		return nil, fmt.Errorf("insert into relation %d before its Relation message", rel)
	}
	if !r.outbox {
		return nil, fmt.Errorf("%w: a row of %s (oid %d), which is not %s: if it is a partition of the outbox, publish via the root "+
			"(ALTER PUBLICATION … SET (publish_via_partition_root = true)); otherwise drop it from the publication",
			ErrUnexpectedRelation, r.name, rel, d.source)
	}
	if !d.inTxn {
		return nil, errors.New("insert outside a transaction")
	}
	if len(vals) != len(r.cols) {
		return nil, fmt.Errorf("insert into %s: tuple of %d columns, relation of %d", d.source, len(vals), len(r.cols))
	}
	e := d.newEvent(walStart, d.source)
	var problems []error
	// value parses column i; ok is false for NULL and for a problem, which
	// it records (a NULL only when the column is required).
	value := func(i int, required bool) (v any, ok bool) {
		name := r.cols[i].Name
		switch vals[i].kind {
		case 't':
		case 'n':
			if required {
				problems = append(problems, fmt.Errorf("column %s is NULL", name))
			}
			return nil, false
		default:
			problems = append(problems, fmt.Errorf("column %s: unsupported tuple value kind %q", name, vals[i].kind))
			return nil, false
		}
		v, err := ParseText(r.cols[i].DataType, vals[i].data)
		if err != nil {
			problems = append(problems, fmt.Errorf("column %s: %w", name, err))
			return nil, false
		}
		return v, true
	}
	// The usual id, key, routing and type columns are text or uuid: their
	// bytes are taken as they are, without boxing a value in an interface,
	// and the four strings share one allocation (substrings of one string
	// made from the concatenation). Other types go through ParseText.
	fields := [4]*string{&e.ID, &e.AggregateType, &e.AggregateID, &e.Type}
	cols := [4]int{r.id, r.aggType, r.aggID, r.typ}
	var plain [4]bool
	d.scratch = d.scratch[:0]
	for k, i := range cols {
		if plain[k] = plainText(r.cols[i].DataType, vals[i]); plain[k] {
			d.scratch = append(d.scratch, vals[i].data...)
		}
	}
	all := string(d.scratch)
	for k, i := range cols {
		if plain[k] {
			*fields[k], all = all[:len(vals[i].data)], all[len(vals[i].data):]
		} else if v, ok := value(i, k != 3); ok { // the type column may be NULL
			if s, ok := v.(string); ok {
				*fields[k] = s
			} else {
				*fields[k] = string(Format(v))
			}
		}
	}
	// The payload is passed on as bytes: json, jsonb and text as stored,
	// bytea decoded from its hex form. The message buffer is reused by the
	// connection, so what the event keeps is copied.
	if p := vals[r.payload]; p.kind == 't' && passThrough(r.cols[r.payload].DataType) {
		e.Payload = bytes.Clone(p.data)
	} else if v, ok := value(r.payload, false); ok {
		switch v := v.(type) {
		case []byte:
			if r.cols[r.payload].DataType == oidBytea {
				e.Payload = v // freshly decoded
			} else {
				e.Payload = bytes.Clone(v)
			}
		default:
			e.Payload = Format(v)
		}
	} else if vals[r.payload].kind != 'n' {
		e.Payload = bytes.Clone(vals[r.payload].data) // keep what failed to parse for the dead-letter record
	}
	for _, i := range r.headers {
		if v, ok := value(i, false); ok {
			e.Headers = append(e.Headers, Header{Key: r.cols[i].Name, Value: bytes.Clone(Format(v))})
		}
	}
	if len(problems) > 0 {
		e.Invalid = errors.Join(problems...)
	}
	return e, nil
}

// plainText reports whether a column value is text that ParseText would
// return unchanged as a string: a text type, or a well-formed uuid.
func plainText(oid uint32, v tupleValue) bool {
	if v.kind != 't' {
		return false
	}
	switch oid {
	case oidText, oidVarchar, oidBpchar, oidName:
		return true
	case oidUUID:
		return isUUID(v.data)
	}
	return false
}

// passThrough reports whether a payload of this type is published as its
// text bytes exactly (ParseText returns them as they are).
func passThrough(oid uint32) bool {
	switch oid {
	case oidJSON, oidJSONB, oidText, oidVarchar:
		return true
	}
	return false
}

// messageBody is the JSON content of a logical decoding message event.
type messageBody struct {
	ID            *string         `json:"id"`
	AggregateType *string         `json:"aggregatetype"`
	AggregateID   *string         `json:"aggregateid"`
	Type          *string         `json:"type"`
	Payload       json.RawMessage `json:"payload"`
}

func (d *Decoder) message(walStart pglogrepl.LSN, m *pglogrepl.LogicalDecodingMessage) (Message, error) {
	switch {
	case m.Prefix == d.cfg.MessagePrefix:
	case m.Prefix == d.heartbeat:
		return Ignored{Kind: "heartbeat"}, nil
	case d.ignored[m.Prefix]:
		return Ignored{Kind: "message_ignored_prefix"}, nil
	default:
		return nil, fmt.Errorf("%w: %q; walrelay reads %q (outbox.message_prefix): if another program emits it, list it in outbox.ignore_message_prefixes",
			ErrUnexpectedPrefix, m.Prefix, d.cfg.MessagePrefix)
	}
	if m.Transactional && !d.inTxn {
		return nil, errors.New("transactional message outside a transaction")
	}
	e := d.newEvent(walStart, "message")
	if !m.Transactional {
		// Emitted whether or not its transaction commits: publishing it
		// would break the outbox promise, so it is dead-lettered.
		*e = Event{Source: "message", WALStart: m.LSN, CommitLSN: m.LSN, Payload: bytes.Clone(m.Content),
			Invalid: errors.New("non-transactional walrelay message: emit it with pg_logical_emit_message(true, …)")}
		return e, nil
	}
	var b messageBody
	if err := json.Unmarshal(m.Content, &b); err != nil {
		e.Payload = bytes.Clone(m.Content)
		e.Invalid = fmt.Errorf("message content is not a JSON object: %w", err)
		return e, nil
	}
	var problems []error
	req := func(p *string, name string) string {
		if p == nil {
			problems = append(problems, fmt.Errorf("message has no %q", name))
			return ""
		}
		return *p
	}
	e.ID = req(b.ID, "id")
	e.AggregateType = req(b.AggregateType, "aggregatetype")
	e.AggregateID = req(b.AggregateID, "aggregateid")
	if b.Type != nil {
		e.Type = *b.Type
	}
	if len(b.Payload) > 0 && string(b.Payload) != "null" {
		e.Payload = b.Payload
	}
	if len(problems) > 0 {
		e.Invalid = errors.Join(problems...)
	}
	return e, nil
}
