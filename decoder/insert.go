package decoder

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/properties"
)

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
		return nil, fmt.Errorf("%w: a row of %s (oid %d), which is not %s: if it is a partition of an outbox, publish via the root "+
			"(ALTER PUBLICATION … SET (publish_via_partition_root = true)); otherwise drop it from the publication",
			ErrUnexpectedRelation, r.name, rel, d.names())
	}
	if !d.inTxn {
		return nil, errors.New("insert outside a transaction")
	}
	if len(vals) != len(r.cols) {
		return nil, fmt.Errorf("insert into %s: tuple of %d columns, relation of %d", r.source, len(vals), len(r.cols))
	}
	return EventMessage{d.tupleEvent(r, vals, d.newEvent(walStart, r.source))}, nil
}

// tupleEvent fills e from an outbox row's values.
func (d *Decoder) tupleEvent(r *relation, vals []tupleValue, e *event.Event) *event.Event {
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
	e.PayloadText, e.PayloadBytes, e.PayloadRequired = r.payloadText, r.payloadBytes, r.payloadRequired
	e.PayloadColumn = r.cols[r.payload].Name
	e.AggregateIDType, e.AggregateIDNullable = r.cols[r.aggID].DataType, r.aggIDNullable
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
	for k, i := range r.headers {
		if vals[i].kind == 'n' {
			// A null header, as Debezium's header placement writes one.
			e.Headers = append(e.Headers, event.Header{Key: r.headerKeys[k]})
		} else if v, ok := value(i, false); ok {
			e.Headers = append(e.Headers, event.Header{Key: r.headerKeys[k], Value: bytes.Clone(Format(v))})
		}
	}
	if r.part >= 0 {
		if v, ok := value(r.part, false); ok {
			if n := v.(int64); n < 0 || n > math.MaxInt32 {
				problems = append(problems, fmt.Errorf("column %s: %d is not a Kafka partition", r.cols[r.part].Name, n))
			} else {
				e.Partition, e.HasPartition = int32(n), true
			}
		}
	}
	if r.version >= 0 {
		// Required: an event published without its version would pass a
		// consumer's version order unchecked.
		if vals[r.version].kind == 'n' {
			problems = append(problems, fmt.Errorf("column %s is NULL: the aggregate's version (outbox.version_column) is required", r.cols[r.version].Name))
		} else if v, ok := value(r.version, true); ok {
			e.Headers = append(e.Headers, event.Header{Key: event.HeaderAggregateVersion, Value: strconv.AppendInt(nil, v.(int64), 10)})
		}
	}
	if r.stamp >= 0 && vals[r.stamp].kind == 't' {
		t, err := parseTime(r.cols[r.stamp].DataType, vals[r.stamp].data)
		if err != nil {
			problems = append(problems, fmt.Errorf("column %s: %w", r.cols[r.stamp].Name, err))
		}
		e.Time = t
	}
	if r.trace >= 0 && vals[r.trace].kind == 't' {
		if parent, state := traceContext(vals[r.trace].data); parent != "" {
			e.Headers = append(e.Headers, event.Header{Key: "traceparent", Value: []byte(parent)})
			if state != "" {
				e.Headers = append(e.Headers, event.Header{Key: "tracestate", Value: []byte(state)})
			}
		}
	}
	if len(problems) > 0 {
		e.Invalid = errors.Join(problems...)
	}
	return e
}

// traceContext reads a trace column's value: a traceparent, or Properties
// text with traceparent and tracestate. parent is "" unless valid, and is
// then the 55 characters of version 00 (W3C Trace Context,
// https://www.w3.org/TR/trace-context/#traceparent-header): a later
// version's is read by its first four fields and passed on in the form of
// version 00, whatever follows them (the spec's "parse the known part and
// ignore the rest"), so that no more than those 55 characters of what a
// writer put in the row reach a header. state is "" unless valid as
// traceTracestate reads it.
func traceContext(v []byte) (parent, state string) {
	if p, ok := traceParent(bytes.TrimSpace(v)); ok {
		return p, ""
	}
	props, err := properties.Parse(v)
	if err != nil {
		return "", ""
	}
	p, ok := traceParent([]byte(props["traceparent"]))
	if !ok {
		return "", ""
	}
	return p, traceState(props["tracestate"])
}

// traceparentSize is the size of a traceparent of version 00.
const traceparentSize = 55

// traceParent reads a W3C traceparent: version, trace id, parent id and
// flags, lower-case hex, the ids not all zeros; version 00 exactly that, a
// later one (not ff) that followed by nothing or by '-' and more fields.
// It returns the version-00 form.
func traceParent(v []byte) (string, bool) {
	if len(v) < traceparentSize || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return "", false
	}
	version, trace, span, flags := v[0:2], v[3:35], v[36:52], v[53:55]
	if !lowerHex(version) || !lowerHex(trace) || !lowerHex(span) || !lowerHex(flags) ||
		allZeros(trace) || allZeros(span) || string(version) == "ff" {
		return "", false
	}
	if len(v) > traceparentSize && (string(version) == "00" || v[traceparentSize] != '-') {
		return "", false
	}
	return "00-" + string(v[3:traceparentSize]), true
}

func lowerHex(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func allZeros(b []byte) bool { return len(bytes.Trim(b, "0")) == 0 }

// Bounds of a tracestate that walrelay passes on: W3C's 32 list members,
// and 512 bytes, the size that the spec asks every vendor to propagate
// (https://www.w3.org/TR/trace-context/#tracestate-limits).
const (
	maxTracestateMembers = 32
	maxTracestateBytes   = 512
)

// traceState reads a W3C tracestate
// (https://www.w3.org/TR/trace-context/#tracestate-header): members
// key=value separated by ',' with blanks (space, tab) around them and
// empty members allowed. It returns them joined by ',' alone, or "" (no
// header) if there are none, more than maxTracestateMembers, a member
// that is not W3C's (a key other than lower-case [a-z0-9_\-*/] with
// one '@' at most, of its sizes; a value not of 1 to 256 printable ASCII
// characters other than ',' and '=', or ending in a space), a key twice,
// or more than maxTracestateBytes in all. The spec lets a vendor drop a
// tracestate that does not parse; no control character (CR, LF) nor
// anything else outside printable ASCII reaches the header.
func traceState(v string) string {
	if v == "" {
		return ""
	}
	var b strings.Builder
	var keys []string
	for m := range strings.SplitSeq(v, ",") {
		m = strings.Trim(m, " \t")
		if m == "" {
			continue
		}
		key, value, ok := strings.Cut(m, "=")
		if !ok || !traceStateKey(key) || !traceStateValue(value) || slices.Contains(keys, key) || len(keys) == maxTracestateMembers {
			return ""
		}
		keys = append(keys, key)
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(m)
		if b.Len() > maxTracestateBytes {
			return ""
		}
	}
	return b.String()
}

// traceStateKey reports whether k is a tracestate key: a simple key (a
// lower-case letter, then at most 255 of [a-z0-9_\-*/]), or a tenant
// (a lower-case letter or digit, then at most 240) '@' a system (a
// lower-case letter, then at most 13).
func traceStateKey(k string) bool {
	keyChars := func(s string, most int, digitFirst bool) bool {
		if s == "" || len(s) > most+1 || !(s[0] >= 'a' && s[0] <= 'z' || digitFirst && s[0] >= '0' && s[0] <= '9') {
			return false
		}
		for i := 1; i < len(s); i++ {
			c := s[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '*' || c == '/') {
				return false
			}
		}
		return true
	}
	tenant, system, multi := strings.Cut(k, "@")
	if !multi {
		return keyChars(k, 255, false)
	}
	return keyChars(tenant, 240, true) && keyChars(system, 13, false)
}

// traceStateValue reports whether v is a tracestate value: 1 to 256
// characters of 0x20 to 0x7e other than ',' and '=', the last not a
// space.
func traceStateValue(v string) bool {
	if v == "" || len(v) > 256 || v[len(v)-1] == ' ' {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7e || c == ',' || c == '=' {
			return false
		}
	}
	return true
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
