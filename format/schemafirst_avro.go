package format

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/hamba/avro/v2"

	"github.com/walrelay/walrelay/format/registry"
)

// ParseAvro parses an Avro schema of the registry with the schemas it
// references (as References gives them, each after those it references
// itself): their named types are parsed first, into the cache the schema
// is parsed with. It is for reading: names are not checked as Java's
// Avro checks them (hamba/avro's own check is off for the whole process),
// so a record that a non-Java producer wrote in a schema with a field
// "first-name" decodes; a schema walrelay writes with is parsed with
// ParseAvroWrite.
//
// hamba/avro panics on some schemas (a record field whose default is of
// its own record, validated: a nil pointer); a registry's answer must not
// stop walrelay or the inbox, so that is an error too.
func ParseAvro(text string, refs []registry.Reference) (s avro.Schema, err error) {
	defer func() {
		if p := recover(); p != nil {
			s, err = nil, fmt.Errorf("parse the Avro schema: hamba/avro fails on it: %v", p)
		}
	}()
	cache := &avro.SchemaCache{}
	for _, r := range refs {
		if _, err := avro.ParseBytesWithCache([]byte(r.Text), "", cache); err != nil {
			return nil, fmt.Errorf("parse the Avro schema's reference %s: %w", r.Name, err)
		}
	}
	schema, err := avro.ParseBytesWithCache([]byte(text), "", cache)
	if err != nil {
		return nil, fmt.Errorf("parse the Avro schema: %w", err)
	}
	if err := avroDecimals(schema, map[avro.Schema]bool{}); err != nil {
		return nil, fmt.Errorf("parse the Avro schema: %w", err)
	}
	return schema, nil
}

// ParseAvroWrite parses an Avro schema that walrelay writes values with
// (a schema-first format's, from the registry or a schema file), as
// ParseAvro does, and refuses (ErrAvroName) the names that Java's Avro
// refuses: Debezium's consumers, and Java's, must read what walrelay
// writes.
func ParseAvroWrite(text string, refs []registry.Reference) (avro.Schema, error) {
	schema, err := ParseAvro(text, refs)
	if err != nil {
		return nil, err
	}
	if err := avroNames(schema, map[avro.Schema]bool{}); err != nil {
		return nil, fmt.Errorf("parse the Avro schema: %w", err)
	}
	return schema, nil
}

// MaxAvroDecimalPrecision bounds a decimal's precision (and so its scale,
// at most its precision) in an Avro schema that ParseAvro takes (a
// schema file, a registry's schema, the inbox's): hamba/avro computes
// 10^scale for every value it decodes or writes (a 2-byte datum of scale
// 10^7 takes seconds), and registered_avro multiplies a payload's
// number by 10^scale. PostgreSQL's numeric takes a precision of at most
// 1000 (its typmod's bound): a schema of a decimal beyond it is refused
// (ErrAvroDecimal), as no column of walrelay's fills it.
const MaxAvroDecimalPrecision = 1000

// ErrAvroDecimal is an Avro schema of a decimal whose precision is beyond
// MaxAvroDecimalPrecision.
var ErrAvroDecimal = errors.New("a decimal's precision beyond the bound")

// avroDecimals checks every decimal logical type in s against
// MaxAvroDecimalPrecision (its scale is at most its precision, or
// hamba/avro drops the logical type).
func avroDecimals(s avro.Schema, seen map[avro.Schema]bool) error {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	if seen[s] {
		return nil
	}
	seen[s] = true
	if l, ok := s.(avro.LogicalTypeSchema); ok {
		if d, ok := l.Logical().(*avro.DecimalLogicalSchema); ok && (d.Precision() > MaxAvroDecimalPrecision || d.Scale() > MaxAvroDecimalPrecision) {
			return fmt.Errorf("a %s decimal of precision %d and scale %d, beyond %d: %w", s.Type(), d.Precision(), d.Scale(), MaxAvroDecimalPrecision, ErrAvroDecimal)
		}
	}
	switch x := s.(type) {
	case *avro.RecordSchema:
		for _, f := range x.Fields() {
			if err := avroDecimals(f.Type(), seen); err != nil {
				return fmt.Errorf("field %q of %q: %w", f.Name(), x.FullName(), err)
			}
		}
	case *avro.ArraySchema:
		return avroDecimals(x.Items(), seen)
	case *avro.MapSchema:
		return avroDecimals(x.Values(), seen)
	case *avro.UnionSchema:
		for _, t := range x.Types() {
			if err := avroDecimals(t, seen); err != nil {
				return err
			}
		}
	}
	return nil
}

// avroNames checks the names in s (its named types' names and namespaces,
// its fields' names, its enums' symbols) as Java's Avro does (avroName):
// hamba/avro's own check is off for the whole process
// (avro.SkipNameValidation), so a schema file or a registry's schema with
// a field "first-name" would otherwise parse, and be written with, though
// no Java consumer reads it (ParseAvroWrite; not what walrelay only
// reads, ParseAvro). The error is ErrAvroName.
func avroNames(s avro.Schema, seen map[avro.Schema]bool) error {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	if seen[s] {
		return nil
	}
	seen[s] = true
	if n, ok := s.(avro.NamedSchema); ok {
		if !avroName(n.Name()) {
			return fmt.Errorf("%s %q: %w", s.Type(), n.Name(), ErrAvroName)
		}
		if ns := n.Namespace(); ns != "" {
			for part := range strings.SplitSeq(ns, ".") {
				if !avroName(part) {
					return fmt.Errorf("%s %q: namespace %q: %w", s.Type(), n.Name(), ns, ErrAvroName)
				}
			}
		}
	}
	switch x := s.(type) {
	case *avro.RecordSchema:
		for _, f := range x.Fields() {
			if !avroName(f.Name()) {
				return fmt.Errorf("field %q of %q: %w", f.Name(), x.FullName(), ErrAvroName)
			}
			if err := avroNames(f.Type(), seen); err != nil {
				return err
			}
		}
	case *avro.EnumSchema:
		for _, sym := range x.Symbols() {
			if !avroName(sym) {
				return fmt.Errorf("symbol %q of enum %q: %w", sym, x.FullName(), ErrAvroName)
			}
		}
	case *avro.ArraySchema:
		return avroNames(x.Items(), seen)
	case *avro.MapSchema:
		return avroNames(x.Values(), seen)
	case *avro.UnionSchema:
		for _, t := range x.Types() {
			if err := avroNames(t, seen); err != nil {
				return err
			}
		}
	}
	return nil
}

// compileAvro parses an Avro schema of the registry (ParseAvroWrite) and
// returns the writer of JSON payloads in it: the JSON converted, by the
// schema, straight into Avro's binary encoding (jsonAvroWriter), a value of
// more than maxBytes (0: no bound) refused with ErrTooLarge as soon as
// the bytes written pass it, before the rest is converted.
func compileAvro(text string, refs []registry.Reference, mismatch func(field, reason string) *MismatchError) (func(dst, payload []byte, maxBytes int) ([]byte, error), error) {
	schema, err := ParseAvroWrite(text, refs)
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
			return nil, fmt.Errorf("%w: its Avro encoding is more than the %d bytes of a record to the topic (stopped at %d bytes written)", ErrTooLarge, maxBytes, len(w.buf))
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
