package schemafirst

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/hamba/avro/v2"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
)

// compileAvro parses an Avro schema of the registry (ParseAvroWrite) and
// returns the writer of JSON payloads in it: the JSON converted, by the
// schema, straight into Avro's binary encoding (jsonAvroWriter), a value of
// more than maxBytes (0: no bound) refused with ErrTooLarge as soon as
// the bytes written pass it, before the rest is converted.
func compileAvro(text string, refs []registry.Reference, mismatch func(field, reason string) *MismatchError) (func(dst, payload []byte, maxBytes int) ([]byte, error), error) {
	schema, err := format.ParseAvroWrite(text, refs)
	if err != nil {
		return nil, err
	}
	defaults := avroDefaults(schema)
	return func(dst, payload []byte, maxBytes int) ([]byte, error) {
		v, err := decodeJSON(payload)
		if err != nil {
			return nil, mismatch("", err.Error())
		}
		w := jsonAvroWriter{buf: dst, max: maxBytes, defaults: defaults, limit: avroSteps(len(payload), maxBytes)}
		field, reason := w.value(schema, v)
		switch {
		case w.stuck:
			return nil, mismatch(w.stuckAt, fmt.Sprintf("its unions' branches could not be resolved within %d values written (%d, %d a byte of the payload, one a byte of the bound of the value): unions of records, whose branches are tried in turn, nested too deep", w.limit, avroStepsBase, avroStepsPerByte))
		case w.over:
			return nil, fmt.Errorf("%w: its Avro encoding is more than the %d bytes of a record to the topic (stopped at %d bytes written)", format.ErrTooLarge, maxBytes, len(w.buf))
		case reason != "":
			return nil, mismatch(field, reason)
		}
		return w.buf, nil
	}, nil
}

// Bounds of registered_avro's work on a payload: the values its writer
// writes (jsonAvroWriter's steps), at most avroStepsBase, avroStepsPerByte
// for each byte of the payload, and one for each byte of the bound of
// the value (a default written from its JSON costs about a step a byte
// written). A payload's values are written once, and again for each
// branch of a union they are tried in; a union keeps the branch it found
// for an object or an array, but a value in it is walked again each time
// the union is (a union of records nested d deep costs some 4·d² steps:
// 660 bytes of 40 levels 6,400, 16 KB of 1,000 levels 4 million, some
// 300 ms). Beyond them the payload is a mismatch (dead-lettered) rather
// than hold the relay: a payload within them costs at most some hundreds
// of milliseconds (some 100 ns a step).
const (
	avroStepsBase    = 1 << 20
	avroStepsPerByte = 64
)

// avroSteps is the bound of steps of a payload of n bytes written within
// maxBytes (0: none).
func avroSteps(n, maxBytes int) int { return avroStepsBase + avroStepsPerByte*n + maxBytes }

// decodeJSON reads one JSON document, numbers as json.Number.
func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if d.More() {
		return nil, fmt.Errorf("not one JSON document: more after it")
	}
	return v, nil
}

// jsonType names a JSON value's type, for errors.
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// pointerToken escapes a JSON pointer's token (RFC 6901).
func pointerToken(s string) string {
	if !strings.ContainsAny(s, "~/") {
		return s
	}
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

func hasField(rs *avro.RecordSchema, name string) bool {
	for _, f := range rs.Fields() {
		if f.Name() == name {
			return true
		}
	}
	return false
}

// latin1 is Avro's JSON encoding of bytes: each code point a byte.
func latin1(s string) ([]byte, bool) {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if r > 0xff {
			return nil, false
		}
		b = append(b, byte(r))
	}
	return b, true
}

// branchName is how hamba/avro names a union's branch: a named type by its
// full name, else its type (with its logical type).
func branchName(s avro.Schema) string {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	name := string(s.Type())
	if ls, ok := s.(avro.LogicalTypeSchema); ok && ls.Logical() != nil {
		name += "." + string(ls.Logical().Type())
	}
	return name
}

// avroTypeName names a schema for errors.
func avroTypeName(s avro.Schema) string {
	if u, ok := s.(*avro.UnionSchema); ok {
		var names []string
		for _, b := range u.Types() {
			names = append(names, branchName(b))
		}
		return strings.Join(names, " | ")
	}
	return branchName(s)
}
