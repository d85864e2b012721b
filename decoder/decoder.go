package decoder

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/walrelay/walrelay/event"
)

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
	version    int      // the version column's index, or -1
	// payloadText and payloadBytes say whether the payload column is of a
	// text type or bytea (Event.PayloadText, PayloadBytes).
	payloadText, payloadBytes bool
	payloadRequired           bool // the layout's PayloadNotNull
	aggIDNullable             bool // the layout's AggregateIDNullable
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
	r.part, r.stamp, r.trace, r.version = -1, -1, -1, -1
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
	if name := l.VersionColumn; name != "" {
		if r.version, err = index(name); err != nil {
			return err
		}
		if t := m.Columns[r.version].DataType; t != oidInt2 && t != oidInt4 && t != oidInt8 {
			return fmt.Errorf("the version column %q of %s is of type oid %d: it must be smallint, integer or bigint", name, r.source, t)
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
