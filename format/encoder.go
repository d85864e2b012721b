package format

import (
	"context"
	"fmt"

	"github.com/walrelay/walrelay/format/registry"
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
	// MaxBytes bounds the value written (the largest record the sink can
	// publish); 0 none. A value whose encoding would be larger is
	// ErrTooLarge, found before it is written (its size counted from its
	// schema and its parsed JSON): an expanded payload of E objects with
	// keys of their own writes about E×E bytes.
	MaxBytes int
}

// AvroEncoder writes keys and values as Debezium does with Apicurio's
// AvroConverter (as-confluent=true, use-id=contentId): the value's Avro
// schema registered under the topic's subject, the value in Avro framed in
// Confluent's wire format. It is safe for concurrent use.
type AvroEncoder struct {
	reg *registry.Client
}

// NewAvroEncoder returns an encoder that registers (or looks up) its
// schemas in reg.
func NewAvroEncoder(reg *registry.Client) *AvroEncoder {
	return &AvroEncoder{reg: reg}
}

// MaxCachedSchemaBytes bounds the compiled schemas a cache keeps
// (SchemaFirst's, the inbox's), by the bytes of their text with their
// references' (CompiledSize): a compiled schema holds some 10 to 16 times
// its text (hamba/avro's schema and decoders, protocompile's descriptors,
// jsonschema's compiled schema), so some 16 to 32 MiB at the bound. A
// schema that would pass it drops the ones used longest ago first, one at
// a time (as the bound in number does).
const MaxCachedSchemaBytes = 2 << 20

// Key writes an aggregate id of column c, the key of topic's record, in
// the column's own schema as Debezium's EventRouter does (KeySchemaOf).
func (e *AvroEncoder) Key(ctx context.Context, topic string, key []byte, c KeyColumn) ([]byte, error) {
	if key == nil {
		return nil, nil
	}
	s, err := KeySchemaOf(c)
	if err != nil {
		return nil, err
	}
	n, err := KeyNode(s, key)
	if err != nil {
		return nil, err
	}
	return e.encode(ctx, registry.Subject(topic, true), s, n, 0)
}

// Value writes a payload, the value of topic's record; a NULL payload is
// a tombstone (nil), as the converter writes a null value.
func (e *AvroEncoder) Value(ctx context.Context, topic string, p Payload) ([]byte, error) {
	if p.Text == nil {
		return nil, nil
	}
	s, n, err := ValueSchema(p)
	if err != nil {
		return nil, err
	}
	return e.encode(ctx, registry.Subject(topic, false), s, n, p.MaxBytes)
}

// ValueSchema is the Connect schema of a non-NULL payload as Debezium's
// EventRouter gives it to the converter, and the payload parsed in it; an
// error (ErrPayload) where Debezium fails on the payload.
func ValueSchema(p Payload) (*ConnectSchema, *Node, error) {
	if !p.Bytes {
		// A json, jsonb or text payload that Debezium expands.
		s, n, top := expandPayload(p.Text, p.Column, p.Expand)
		if top {
			// EventRouterDelegate sets the value's schema to the one
			// JsonSchemaData infers, then its toConnectData throws (Not a
			// struct schema), leaving the string in an array schema,
			// which the converter fails on (for [], a null schema, on
			// which getValueSchema throws): Debezium's task stops.
			return nil, nil, fmt.Errorf("%w: a top-level JSON array, which Debezium's EventRouter cannot expand (its task fails on it)", registry.ErrPayload)
		}
		if s != nil {
			if s.Type == "struct" {
				// The converter registers the schema of the Avro datum
				// it writes: a record's own, not the optional union
				// around it.
				c := *s
				c.Required = true
				s = &c
			}
			return s, n, nil
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
	return s, &Node{Kind: KindString, Text: string(p.Text)}, nil
}

// Expand is the schema and parsed value of a JSON payload that Debezium's
// EventRouter expands (expand set: table.expand.json.payload=true), nil
// where it leaves the payload a string (or fails on it: a top-level
// array, see ValueSchema).
func Expand(text []byte, column string, expand bool) (*ConnectSchema, *Node) {
	s, n, top := expandPayload(text, column, expand)
	if top {
		return nil, nil
	}
	return s, n
}

// expandPayload is Expand, and top: the payload is a top-level array whose schema
// JsonSchemaData infers (or finds none for, []), on which Debezium fails.
func expandPayload(text []byte, column string, expand bool) (s *ConnectSchema, n *Node, top bool) {
	if !expand || len(text) == 0 || (text[0] != '{' && text[0] != '[') {
		return nil, nil, false
	}
	n, err := ParseJSON(javaSurrogates(text))
	if err != nil {
		return nil, nil, false
	}
	s, err = InferSchema(column, n)
	if err != nil {
		return nil, nil, false
	}
	if n.Kind == KindArray {
		return nil, nil, true
	}
	if s == nil {
		return nil, nil, false
	}
	return s, n, false
}

// javaSurrogates rewrites each JSON escape of a lone UTF-16 surrogate
// (\ud800 not followed by a low one's escape, a \udc00 not after a high
// one's) as '?', which is what Debezium writes for it: Jackson reads it
// into a Java string, and Java's UTF-8 encoder writes an unpaired
// surrogate as '?' (Go's decoder would make it U+FFFD). text is returned
// as it is when it has none.
func javaSurrogates(text []byte) []byte {
	var out []byte
	last := 0
	for i := 0; i < len(text); i++ {
		if text[i] != '\\' {
			continue
		}
		if i+1 >= len(text) {
			break
		}
		if text[i+1] != 'u' {
			i++ // an escaped character: \\ is not the start of an escape
			continue
		}
		u, ok := hex4(text, i+2)
		if !ok {
			i++
			continue
		}
		switch {
		case u >= 0xd800 && u < 0xdc00:
			if i+11 < len(text) && text[i+6] == '\\' && text[i+7] == 'u' {
				if l, ok := hex4(text, i+8); ok && l >= 0xdc00 && l < 0xe000 {
					i += 11 // a pair
					continue
				}
			}
		case u >= 0xdc00 && u < 0xe000:
		default:
			i += 5
			continue
		}
		out = append(append(out, text[last:i]...), '?')
		last = i + 6
		i += 5
	}
	if out == nil {
		return text
	}
	return append(out, text[last:]...)
}

// hex4 is the value of the four hex digits at text[i:].
func hex4(text []byte, i int) (rune, bool) {
	if i+4 > len(text) {
		return 0, false
	}
	var r rune
	for _, c := range text[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// encode writes n in s, registered under subject, within maxBytes (0 no
// bound). The schema's text is bounded by the registry's MaxSchemaBytes as
// it is written, and the value's size counted before it is written, so
// that neither is built beyond its bound.
func (e *AvroEncoder) encode(ctx context.Context, subject string, s *ConnectSchema, n *Node, maxBytes int) ([]byte, error) {
	as, err := avroWithin(s, e.reg.MaxSchemaBytes())
	if err != nil {
		return nil, fmt.Errorf("subject %s: %w: %w", subject, registry.ErrPayload, err)
	}
	size := AvroSize(s, n)
	if maxBytes > 0 && size > int64(maxBytes) {
		return nil, fmt.Errorf("%w: its Avro encoding would be %d bytes, more than the %d of a record to the topic", ErrTooLarge, size, maxBytes)
	}
	body, err := encodeAvro(s, n, int(min(size, 1<<20)))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", registry.ErrPayload, err)
	}
	id, err := e.reg.ID(ctx, subject, as.Text)
	if err != nil {
		return nil, err
	}
	return registry.Frame(make([]byte, 0, 5+len(body)), id, body), nil
}

// Registry is the encoder's schema registry.
func (e *AvroEncoder) Registry() *registry.Client { return e.reg }
