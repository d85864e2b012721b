package format

import (
	"context"
	"errors"
	"fmt"
)

// Payload is an outbox payload and what Debezium's EventRouter knows of its
// column.
type Payload struct {
	// Text is the payload as stored; nil is NULL.
	Text []byte
	// Column is the payload column's name: it names the record of an
	// expanded payload.
	Column string
	// Bytes, TextColumn: the column is bytea, or text (else json or
	// jsonb). Required: the column is NOT NULL.
	Bytes, TextColumn, Required bool
	// Expand is table.expand.json.payload: a JSON object or array becomes
	// a record (or array) of the schema inferred from it.
	Expand bool
}

// ErrPayload is a payload that the format cannot write (Debezium's
// converter fails on it too): the event goes to the dead-letter topic.
var ErrPayload = errors.New("the payload cannot be written in the format")

// AvroEncoder writes keys and values as Debezium does with Apicurio's
// AvroConverter (as-confluent=true, use-id=contentId): the value's Avro
// schema registered under the topic's subject, the value in Avro framed in
// Confluent's wire format. It is safe for concurrent use.
type AvroEncoder struct {
	reg *Registry
}

// NewAvroEncoder returns an encoder that registers (or looks up) its
// schemas in reg.
func NewAvroEncoder(reg *Registry) *AvroEncoder {
	return &AvroEncoder{reg: reg}
}

// maxCachedSchemas bounds the parsed schemas kept (by SchemaFirst).
const maxCachedSchemas = 1000

// Key writes an aggregate id, the key of topic's record.
func (e *AvroEncoder) Key(ctx context.Context, topic string, key []byte) ([]byte, error) {
	if key == nil {
		return nil, nil
	}
	return e.encode(ctx, Subject(topic, true), KeySchema, &Node{Kind: KindString, Text: string(key)})
}

// Value writes a payload, the value of topic's record; a NULL payload is
// a tombstone (nil), as the converter writes a null value.
func (e *AvroEncoder) Value(ctx context.Context, topic string, p Payload) ([]byte, error) {
	if p.Text == nil {
		return nil, nil
	}
	s, n := ValueSchema(p)
	return e.encode(ctx, Subject(topic, false), s, n)
}

// ValueSchema is the Connect schema of a non-NULL payload as Debezium's
// EventRouter gives it to the converter, and the payload parsed in it.
func ValueSchema(p Payload) (*ConnectSchema, *Node) {
	if !p.Bytes {
		// A json, jsonb or text payload that Debezium expands.
		if s, n := Expand(p.Text, p.Column, p.Expand); s != nil {
			if s.Type == "struct" {
				// The converter registers the schema of the Avro datum
				// it writes: a record's own, not the optional union
				// around it (a string's or an array's, a container of
				// the union).
				c := *s
				c.Required = true
				s = &c
			}
			return s, n
		}
	}
	var s *ConnectSchema
	switch {
	case p.Bytes:
		s = BytesSchema
	case p.TextColumn:
		s = TextSchema
	default:
		s = JSONTextSchema
	}
	if p.Required {
		c := *s
		c.Required = true
		s = &c
	}
	return s, &Node{Kind: KindString, Text: string(p.Text)}
}

// Expand is the schema and parsed value of a JSON payload that Debezium's
// EventRouter expands (expand set: table.expand.json.payload=true), nil
// where it leaves the payload a string.
func Expand(text []byte, column string, expand bool) (*ConnectSchema, *Node) {
	if !expand || len(text) == 0 || (text[0] != '{' && text[0] != '[') {
		return nil, nil
	}
	n, err := ParseJSON(text)
	if err != nil {
		return nil, nil
	}
	s, err := InferSchema(column, n)
	if err != nil || s == nil {
		return nil, nil
	}
	return s, n
}

func (e *AvroEncoder) encode(ctx context.Context, subject string, s *ConnectSchema, n *Node) ([]byte, error) {
	as, err := Avro(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPayload, err)
	}
	body, err := as.EncodeAvro(s, n)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPayload, err)
	}
	id, err := e.reg.ID(ctx, subject, as.Text)
	if err != nil {
		return nil, err
	}
	return Frame(make([]byte, 0, 5+len(body)), id, body), nil
}
