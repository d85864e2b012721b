package inbox

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kgo"
)

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

// idReason is the dead-letter reason of an eventID failure, "" for any
// other error.
func idReason(err error) string {
	switch {
	case errors.Is(err, errNoID):
		return "no_id"
	case errors.Is(err, errEmptyID):
		return "empty_id"
	case errors.Is(err, errSeveralIDs):
		return "several_ids"
	}
	return ""
}

// logID is r's event id for a log line or a dead letter's log: "" if it
// has none or several.
func logID(r *kgo.Record) string {
	id, _ := eventID(r)
	return id
}

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
