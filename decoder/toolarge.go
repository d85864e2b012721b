package decoder

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/walrelay/walrelay/event"
)

// Cut is a value left out of a message too large to hold.
type Cut struct {
	// Column is the value's index in an insert's tuple; for a logical
	// decoding message, 0: its content.
	Column int
	// Size is the value's size in bytes; -1 when unknown (the content of a
	// message whose prefix was too long to read).
	Size int64
}

// TooLarge describes a pgoutput message over the size walrelay holds in
// memory, which the replication stream read as it arrived and dropped.
type TooLarge struct {
	// Head is the message cut down: an insert with each value left out
	// given as NULL, a logical message with its content cut short (its
	// length field saying so), another message's first bytes.
	Head []byte
	// Size is the message's size in bytes, and Limit the size it is over.
	Size, Limit int64
	// Cuts are the values left out.
	Cuts []Cut
}

// DecodeTooLarge decodes a message too large to hold from what was kept of
// it. An insert into an outbox table, or a logical message under the read
// prefix, yields an EventMessage whose event is Invalid (wrapping
// event.ErrTooLarge: the sink dead-letters it as too_large), without a
// payload (OmittedBytes its size), with what identifies it that was kept:
// the id, aggregate type and id and type columns that fit, or in a message
// the members that precede the payload in its JSON. An update or delete is
// Ignored as always. Anything else is an *Error that names the setting to
// raise: such a message cannot be read without holding it.
func (d *Decoder) DecodeTooLarge(walStart pglogrepl.LSN, m TooLarge) (Message, error) {
	if len(m.Head) == 0 {
		return nil, &Error{WALStart: walStart, Err: errors.New("empty message")}
	}
	typ := m.Head[0]
	var msg Message
	var err error
	switch typ {
	case 'I':
		msg, err = d.tooLargeInsert(walStart, m)
	case 'M':
		msg, err = d.tooLargeMessage(walStart, m)
	case 'U', 'D':
		return d.Decode(walStart, m.Head[:1])
	default:
		err = fmt.Errorf("a message of %d bytes, over postgres.max_message_bytes (%d): raise it to read this message", m.Size, m.Limit)
	}
	if err != nil {
		var de *Error
		if errors.As(err, &de) {
			return nil, err
		}
		return nil, &Error{WALStart: walStart, MsgType: typ, Err: err}
	}
	return msg, nil
}

// tooLargeError is the Invalid error of an event too large to hold.
func tooLargeError(what string, m TooLarge, left []string) error {
	return fmt.Errorf("%w: %s of %d bytes is over postgres.max_message_bytes (%d); left out: %s", event.ErrTooLarge, what, m.Size, m.Limit, strings.Join(left, ", "))
}

func (d *Decoder) tooLargeInsert(walStart pglogrepl.LSN, m TooLarge) (Message, error) {
	msg, err := d.insert(walStart, m.Head)
	if err != nil {
		return nil, err
	}
	e := msg.(EventMessage).Event
	r := d.rels[binary.BigEndian.Uint32(m.Head[1:5])]
	left := make([]string, 0, len(m.Cuts))
	omitted := int64(len(e.Payload))
	for _, c := range m.Cuts {
		if c.Column < 0 || c.Column >= len(r.cols) {
			return nil, fmt.Errorf("a value left out of column %d of a tuple of %d", c.Column, len(r.cols))
		}
		if c.Column == r.payload {
			omitted = c.Size
		}
		left = append(left, fmt.Sprintf("column %s (%d bytes)", r.cols[c.Column].Name, c.Size))
	}
	e.Payload, e.OmittedBytes = nil, omitted
	e.Invalid = tooLargeError("the insert into "+r.source, m, left)
	return msg, nil
}

func (d *Decoder) tooLargeMessage(walStart pglogrepl.LSN, m TooLarge) (Message, error) {
	pm, err := parse(m.Head)
	if err != nil {
		return nil, err
	}
	lm, ok := pm.(*pglogrepl.LogicalDecodingMessage)
	if !ok || len(m.Cuts) != 1 {
		return nil, errors.New("a logical decoding message cut down without its content's size")
	}
	msg, err := d.message(walStart, lm)
	em, ok := msg.(EventMessage)
	if err != nil || !ok {
		return msg, err // another prefix: as for a message of any size
	}
	e := em.Event
	f := headFields(lm.Content)
	for i, p := range []*string{&e.ID, &e.AggregateType, &e.AggregateID, &e.Type} {
		if *p == "" {
			*p = f[i]
		}
	}
	e.Payload, e.OmittedBytes = nil, m.Cuts[0].Size
	invalid := tooLargeError("the message", m, []string{fmt.Sprintf("its content (%d bytes)", m.Cuts[0].Size)})
	if !lm.Transactional || errors.Is(e.Invalid, event.ErrBeforePrivileges) {
		invalid = errors.Join(invalid, e.Invalid) // non-transactional, or untrusted, as well
	}
	e.Invalid = invalid
	return msg, nil
}

// headFields reads the string members id, aggregatetype, aggregateid and
// type at the top level of the JSON object that b starts, up to where b
// ends or the JSON breaks: what identifies a message whose content was cut.
func headFields(b []byte) (f [4]string) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return f
	}
	for {
		k, err := dec.Token()
		if err != nil {
			return f
		}
		v, err := dec.Token()
		if err != nil {
			return f
		}
		if s, ok := v.(string); ok {
			switch k {
			case "id":
				f[0] = s
			case "aggregatetype":
				f[1] = s
			case "aggregateid":
				f[2] = s
			case "type":
				f[3] = s
			}
			continue
		}
		if d, ok := v.(json.Delim); ok && (d == '{' || d == '[') {
			for depth := 1; depth > 0; {
				t, err := dec.Token()
				if err != nil {
					return f
				}
				if d, ok := t.(json.Delim); ok {
					if d == '{' || d == '[' {
						depth++
					} else {
						depth--
					}
				}
			}
		}
	}
}
