package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/format/schemafirst"
	"github.com/walrelay/walrelay/sink/record"
)

// Reasons of the dead letters of the registry formats (and of json_schema).
const (
	// ReasonFormat is a payload the format cannot write (a name Avro
	// refuses, a number beyond a long, a json_schema envelope nesting
	// deeper than Jackson writes), as Debezium's converter fails on it.
	ReasonFormat = "format"
	// ReasonSchemaRefused is a value's schema, or a logical message's
	// key's, that the registry refuses (incompatible, invalid) or,
	// without auto-registration, does not have under its subject.
	ReasonSchemaRefused = "schema_refused"
)

// sourceMessage is the Event.Source of a logical decoding message.
const sourceMessage = "message"

// registryEncode writes r's key and value in record.FormatAvro, where the sink's
// formats say so, and reports whether r is to be published: an event that
// the format cannot write, or whose value's schema the registry refuses,
// is dead-lettered, and so is a logical message whose key's schema it
// refuses; a row's refused key schema (its table column's, the same for
// every row of the topic) fails it as fatal, as ErrKeyType does; a
// registry that refuses the credentials fails it as fatal (walrelay
// stops, naming the keys); one that does not answer fails it as transient
// (the stream restarts, nothing is sent past it).
func (s *Sink) registryEncode(ctx context.Context, e *event.Event, r *kgo.Record, topic string, gen uint64, done Done) bool {
	what, err := s.registryWrite(ctx, e, r, topic)
	f := s.cfg.ValueFormat // the format of what
	if what == "key" {
		f = s.cfg.KeyFormat
	}
	switch {
	case err == nil:
		return true
	case errors.Is(err, format.ErrKeyType):
		// Refused at start (CheckKeyColumn); a column whose type changed
		// since stops walrelay rather than dead-letter every event.
		s.q.BreakOn(err)
		done(Delivery{Topic: topic, Partition: -1}, failure.Mark(failure.Fatal, fmt.Errorf("publish event %s to %s: the key in %s: %w", e.ID, topic, s.cfg.KeyFormat, err)))
	case what == "key" && (errors.Is(err, registry.ErrRefused) || errors.Is(err, registry.ErrNotRegistered)) && e.Source == sourceMessage:
		// A logical message's key is a string whatever the table's
		// column (whose schema was checked at start): on a topic that
		// rows of a bigint column share, the registry refuses one of the
		// two. Not the table's schema, so not a reason to stop: the
		// message alone is dead-lettered.
		s.deadLetter(ctx, e, ReasonSchemaRefused, topic, fmt.Errorf("the key's schema of a logical message (a string, whatever the outbox table's aggregate id column) under %s: %w", registry.Subject(topic, true), err), gen, done)
	case what == "key" && (errors.Is(err, registry.ErrRefused) || errors.Is(err, registry.ErrNotRegistered)):
		// A row's key schema follows its table's aggregate id column
		// (its type and NOT NULL): the same for every row of the topic,
		// so a refused one would dead-letter them all. walrelay stops,
		// as Debezium's converter fails its task, with nothing confirmed
		// past the event.
		s.q.BreakOn(err)
		done(Delivery{Topic: topic, Partition: -1}, failure.Mark(failure.Fatal, fmt.Errorf("publish event %s to %s: the key's schema: %w: %s", e.ID, topic, err, keySchemaFix(topic, err))))
	case errors.Is(err, schemafirst.ErrMismatch):
		s.deadLetter(ctx, e, ReasonSchemaMismatch, topic, fmt.Errorf("the %s in %s: %w", what, f, err), gen, done)
	case errors.Is(err, format.ErrTooLarge):
		s.deadLetter(ctx, e, "too_large", topic, fmt.Errorf("%w: the %s in %s: %w", kerr.MessageTooLarge, what, f, err), gen, done)
	case errors.Is(err, registry.ErrPayload):
		s.deadLetter(ctx, e, ReasonFormat, topic, fmt.Errorf("the %s in %s: %w", what, f, err), gen, done)
	case errors.Is(err, registry.ErrRefused), errors.Is(err, registry.ErrNotRegistered):
		s.deadLetter(ctx, e, ReasonSchemaRefused, topic, fmt.Errorf("the %s's schema: %w", what, err), gen, done)
	case errors.Is(err, registry.ErrUnauthorized):
		s.q.BreakOn(err)
		done(Delivery{Topic: topic, Partition: -1}, failure.Mark(failure.Fatal, fmt.Errorf("publish event %s to %s: the %s's schema: %w: fix kafka.schema_registry.username and its password", e.ID, topic, what, err)))
	default:
		// Nothing after this event may be sent before it: the stream
		// restarts from the confirmed position, as after a failed publish.
		s.q.BreakOn(err)
		done(Delivery{Topic: topic, Partition: -1}, failure.Mark(failure.Retriable, fmt.Errorf("publish event %s to %s: the %s's schema: %w", e.ID, topic, what, err)))
	}
	return false
}

// registryWrite writes r's key and value in the registry formats
// (registryEncode), and says which of the two an error is about. A panic
// of the code that writes them (hamba/avro, Go's protobuf, the JSON
// Schema validator, on a registry's schema or an application's payload)
// is the event's format error, dead-lettered with its text: left to run,
// it would stop walrelay, and again at every start on the same event.
func (s *Sink) registryWrite(ctx context.Context, e *event.Event, r *kgo.Record, topic string) (what string, err error) {
	what = "key"
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: writing the %s panicked: %v", registry.ErrPayload, what, p)
		}
	}()
	if s.cfg.KeyFormat == record.FormatAvro {
		r.Key, err = s.cfg.Avro.Key(ctx, topic, r.Key, record.KeyColumn(e))
	}
	if err == nil && s.cfg.ValueFormat == record.FormatAvro && !(s.cfg.TombstoneOnEmpty && record.Blank(e.Payload)) {
		what = "value"
		r.Value, err = s.cfg.Avro.Value(ctx, topic, format.Payload{
			Text: e.Payload, Column: e.PayloadColumn, Bytes: e.PayloadBytes, TextColumn: e.PayloadText,
			Required: e.PayloadRequired, Expand: s.cfg.ExpandJSONPayload,
			// A value over the topic's batch cap is refused before it is
			// written: the client would refuse the record anyway.
			MaxBytes: int(s.batchCapOf(topic)),
		})
	}
	if err == nil && s.cfg.ValueFormat != record.FormatAvro && s.cfg.ValueFormat.Registry() && !(s.cfg.TombstoneOnEmpty && record.Blank(e.Payload)) {
		what = "value"
		r.Value, err = s.schemaFirstValue(ctx, e, topic)
	}
	return what, err
}

// keySchemaFix says what to do when the registry refuses, or does not
// have, the key's schema of a row of topic (err).
func keySchemaFix(topic string, err error) string {
	subject := registry.Subject(topic, true)
	if errors.Is(err, registry.ErrNotRegistered) {
		return fmt.Sprintf("a row's key schema follows its table's aggregate id column (its type and NOT NULL) and is the same for every row of the topic, so walrelay stops rather than dead-letter each row: register it under %s (or turn on kafka.schema_registry.auto_register), then start walrelay again", subject)
	}
	return fmt.Sprintf("a row's key schema follows its table's aggregate id column (its type and NOT NULL) and is the same for every row of the topic, so walrelay stops rather than dead-letter each row. %s holds another key schema: a logical message's (a string, whatever the column) or another outbox table's of another id type, written to the topic first, or the column's before a DDL changed its type or NOT NULL. Let %s take this one (its compatibility, e.g. NONE), or route the other events to another topic, or undo the DDL; then start walrelay again", subject, subject)
}
