package decoder

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/walrelay/walrelay/event"
)

// messageBody is the JSON content of a logical decoding message event.
type messageBody struct {
	ID            *string         `json:"id"`
	AggregateType *string         `json:"aggregatetype"`
	AggregateID   *string         `json:"aggregateid"`
	Type          *string         `json:"type"`
	Payload       json.RawMessage `json:"payload"`
}

// maxPrefixKept bounds what is kept of an ignored message's prefix.
const maxPrefixKept = 200

// ShortPrefix is prefix, or its first bytes and "…" when it is longer than
// walrelay keeps: any role chooses a message's prefix, and it may be
// megabytes long. The result shares no memory with prefix.
func ShortPrefix(prefix string) string {
	if len(prefix) <= maxPrefixKept {
		return strings.Clone(prefix)
	}
	return strings.ToValidUTF8(prefix[:maxPrefixKept], "") + "…"
}

func (d *Decoder) message(walStart pglogrepl.LSN, m *pglogrepl.LogicalDecodingMessage) (Message, error) {
	// Any role can emit a message under any prefix: none but the read
	// prefix with Messages on may be an event, and none may stop the
	// stream. (A walrelay_emit emitting under a prefix walrelay does not
	// read is caught before streaming: relay.CheckEmitFunction.)
	switch {
	case m.Prefix == d.cfg.MessagePrefix && d.cfg.Messages:
	case m.Prefix == d.cfg.MessagePrefix:
		return Ignored{Kind: "message_source_off", Prefix: ShortPrefix(m.Prefix)}, nil
	case m.Prefix == d.heartbeat:
		return Ignored{Kind: "heartbeat"}, nil
	case d.ignored[m.Prefix]:
		return Ignored{Kind: "message_ignored_prefix", Prefix: ShortPrefix(m.Prefix)}, nil
	default:
		return Ignored{Kind: "message_foreign_prefix", Prefix: ShortPrefix(m.Prefix)}, nil
	}
	if m.Transactional && !d.inTxn {
		return nil, errors.New("transactional message outside a transaction")
	}
	e := d.newEvent(walStart, "message")
	if !m.Transactional {
		// Emitted whether or not its transaction commits: publishing it
		// would break the outbox promise, so it is dead-lettered.
		*e = event.Event{Source: "message", WALStart: m.LSN, CommitLSN: m.LSN, Payload: bytes.Clone(m.Content),
			Invalid: errors.New("non-transactional walrelay message: emit it with pg_logical_emit_message(true, …)")}
		return EventMessage{e}, nil
	}
	var b messageBody
	if err := json.Unmarshal(m.Content, &b); err != nil {
		e.Payload = bytes.Clone(m.Content)
		e.Invalid = fmt.Errorf("message content is not a JSON object: %w", err)
		d.beforePrivileges(e)
		return EventMessage{e}, nil
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
	d.beforePrivileges(e)
	return EventMessage{e}, nil
}

// beforePrivileges marks e, a message of the open transaction, as one to
// dead-letter with event.ErrBeforePrivileges (whatever else is wrong with
// it) when the transaction is older than Config.MessagesFrom: any role
// may have emitted it.
func (d *Decoder) beforePrivileges(e *event.Event) {
	if d.cfg.MessagesFrom == 0 || d.txnXid >= d.cfg.MessagesFrom {
		return
	}
	err := fmt.Errorf("%w: transaction %d, messages are trusted from transaction %d (walrelay migrate recorded it)", event.ErrBeforePrivileges, d.txnXid, d.cfg.MessagesFrom)
	if e.Invalid != nil {
		err = errors.Join(err, e.Invalid)
	}
	e.Invalid = err
}
