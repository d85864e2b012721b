package inbox

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/textcut"
)

// Message is one Kafka record handed to the handler.
type Message struct {
	ID        string // the "id" header, the event id: the record's only one, not empty
	Type      string // the "type" header; empty if the relay left it out (kafka.headers)
	Key       []byte
	Value     []byte // nil for a tombstone
	Headers   map[string][]byte
	Topic     string
	Partition int32
	Offset    int64
	Timestamp time.Time
	// Attempt counts the handler's runs for this record, from 1: every
	// run, whatever ended the one before (the handler's error, a session
	// cut, a server restart, or a batch whose commit failed and is handled
	// again one record per transaction, when the handlers of records that
	// did nothing wrong run again). Greater than 1, the handler's effects
	// inside tx were undone, but anything it did outside (an e-mail, an
	// HTTP call) was done already: make such effects idempotent, keyed on
	// ID. Counted by this process's worker of the partition: a record
	// delivered again after a rebalance or a restart of the process
	// starts at 1 again.
	Attempt int
	// reg is Config.Registry, for Decode.
	reg *Registry
}

// Handler handles one message inside tx, the transaction that also claims
// its id; the claim commits only with the handler's changes. It must not
// commit or roll back tx. An error (or a panic) undoes the message's
// changes and the claim; the message is retried.
type Handler func(ctx context.Context, tx pgx.Tx, m Message) error

// The failures of a record whose event id cannot be read: it cannot be
// deduplicated, so it is dead-lettered (with the reason idReason gives)
// instead of handled.
var (
	errNoID       = errors.New(`the record has no "id" header: it cannot be deduplicated`)
	errEmptyID    = errors.New(`the record's "id" header is empty: it cannot be deduplicated`)
	errSeveralIDs = errors.New(`the record has several "id" headers (a header column published as "id"?): which one is the event id is unknown`)
)

// eventID is r's event id: the value of its one "id" header, the only
// reading of it (the claim, the handler's Message, logs and dead
// letters). A record with none, an empty one or several fails with
// errNoID, errEmptyID or errSeveralIDs.
func eventID(r *kgo.Record) (string, error) {
	var id []byte
	n := 0
	for _, h := range r.Headers {
		if h.Key == "id" {
			id = h.Value
			n++
		}
	}
	switch {
	case n == 0:
		return "", errNoID
	case n > 1:
		return "", errSeveralIDs
	case len(id) == 0:
		return "", errEmptyID
	}
	return string(id), nil
}

// idReason is the dead-letter reason of a record that cannot be read
// (Consumer.unreadable: its event id, or its version), "" for any other
// error.
func idReason(err error) string {
	switch {
	case errors.Is(err, errNoID):
		return "no_id"
	case errors.Is(err, errEmptyID):
		return "empty_id"
	case errors.Is(err, errSeveralIDs):
		return "several_ids"
	case errors.Is(err, errInvalidVersion):
		return "invalid_version"
	}
	return ""
}

// logID is r's event id for a log line or a dead letter's log, clipped
// (clipID): "" if it has none or several.
func logID(r *kgo.Record) string {
	id, _ := eventID(r)
	return clipID(id)
}

// clipID is an event id as the inbox's log lines and errors quote it.
func clipID(id string) string { return textcut.ID(id) }

// message is the Message of r, whose event id is id.
func message(r *kgo.Record, id string, attempt int) Message {
	m := Message{ID: id, Key: r.Key, Value: r.Value, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp,
		Headers: make(map[string][]byte, len(r.Headers)), Attempt: attempt}
	for _, h := range r.Headers {
		m.Headers[h.Key] = h.Value
	}
	m.Type = string(m.Headers["type"])
	return m
}
