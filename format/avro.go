package format

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/hamba/avro/v2"
)

// The Avro schema of a value is its Kafka Connect schema as Apicurio's
// AvroConverter (io.apicurio.registry.utils.converter.AvroConverter, with
// its AvroData, a copy of Confluent's) translates it, written as Avro's
// Java library writes a schema (Schema.toString), the text the converter
// registers:
//   - int32 int, int64 long, double double, boolean boolean, string string,
//     bytes bytes, array {"type":"array","items":…};
//   - a struct is a record named by the Connect name split at its last dot
//     (namespace and name; a struct without a name is
//     io.confluent.connect.avro.ConnectDefault, then ConnectDefault2, … in
//     the order they are met), with "connect.name" the Connect name;
//   - an optional schema is the union ["null", T] (the connect.*
//     properties on T), and an optional field has "default":null;
//   - a Connect name or version on a primitive becomes the properties
//     "connect.version" and "connect.name" on it;
//   - a record's namespace is written only where it differs from the
//     enclosing one's ("" for none inside one), as Avro's Java library does.
//
// A name that Avro refuses (a field "first-name") fails Debezium's
// converter: walrelay refuses it too (ErrAvroName), as AvroData does with
// its default scrub.invalid.names=false. Avro's Java library (1.12, the
// converter's) allows more than the specification's ASCII names: a letter
// or '_', then letters, digits or '_', as Character.isLetter and
// isLetterOrDigit see a UTF-16 unit (so "ünï" is a name, a letter beyond
// the Basic Multilingual Plane is not); walrelay checks names so, and
// hamba/avro's own (ASCII) check is off (avro.SkipNameValidation, set
// once at start: the package's schemas are written or checked here, or
// come from a registry that took them).

// defaultNamespace and defaultName name a record whose struct has no name
// (AvroData.NAMESPACE and DEFAULT_SCHEMA_NAME).
const (
	defaultNamespace = "io.confluent.connect.avro"
	defaultName      = "ConnectDefault"
)

// ErrAvroName is a field or record name that Avro does not allow.
var ErrAvroName = errors.New("not a valid Avro name")

func init() {
	avro.SkipNameValidation = true
}

// avroName is Avro 1.12's Java name check (NameValidator.UTF_VALIDATOR).
func avroName(name string) bool {
	if name == "" {
		return false
	}
	for i, r := range name {
		ok := r == '_' || r <= 0xffff && (unicode.IsLetter(r) || i > 0 && unicode.IsDigit(r))
		if !ok {
			return false
		}
	}
	return true
}

// AvroSchema is an Avro schema translated from a Connect schema: its text
// as the converter registers it (EncodeAvro writes values of it).
type AvroSchema struct {
	Text string
}

// Primitive Connect schemas of the outbox's non-expanded keys and values,
// as Debezium's EventRouter gives them to the converter.
var (
	// KeySchema is the aggregate id: a required string.
	KeySchema = &ConnectSchema{Type: "string", Required: true}
	// JSONTextSchema is a json or jsonb payload left a string: a string
	// named io.debezium.data.Json, version 1.
	JSONTextSchema = &ConnectSchema{Type: "string", Name: "io.debezium.data.Json", Version: 1}
	// TextSchema is a text payload.
	TextSchema = &ConnectSchema{Type: "string"}
	// BytesSchema is a bytea payload.
	BytesSchema = &ConnectSchema{Type: "bytes"}
)

// Avro translates s into its Avro schema. A schema whose text nests
// deeper than Jackson writes (MaxNestingDepth: a payload of some 250
// nested objects) is an error: Debezium's converter fails on it.
func Avro(s *ConnectSchema) (*AvroSchema, error) {
	return avroWithin(s, 0)
}

// errSchemaSize is a schema text over its bound (avroWithin).
var errSchemaSize = errors.New("schema over its bound")

// avroWithin is Avro, failing as soon as the text passes maxBytes (0 no
// bound): the text of an inferred schema grows with the keys of the
// payload (some 50 bytes a field, ten times the key's own).
func avroWithin(s *ConnectSchema, maxBytes int) (*AvroSchema, error) {
	w := &avroWriter{max: maxBytes}
	if err := w.schema(s, ""); err != nil {
		if errors.Is(err, errSchemaSize) {
			return nil, fmt.Errorf("its schema is more than the %d bytes that walrelay sends to a registry (Confluent's keeps a schema in one Kafka record)", maxBytes)
		}
		return nil, err
	}
	if maxBytes > 0 && len(w.b) > maxBytes {
		return nil, fmt.Errorf("its schema is %d bytes, more than the %d that walrelay sends to a registry (Confluent's keeps a schema in one Kafka record)", len(w.b), maxBytes)
	}
	if d := Nesting(w.b); d > MaxNestingDepth {
		return nil, fmt.Errorf("the Avro schema of the payload nests %d deep, more than the %d that Jackson writes (Debezium's converter fails on it)", d, MaxNestingDepth)
	}
	return &AvroSchema{Text: string(w.b)}, nil
}

// Nesting is the deepest nesting of objects and arrays in a JSON text.
func Nesting(text []byte) int {
	depth, deepest, quoted := 0, 0, false
	for i := 0; i < len(text); i++ {
		switch c := text[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}

type avroWriter struct {
	b        []byte
	defaults int // records named ConnectDefault so far
	max      int // the most bytes of b, 0 no bound (errSchemaSize)
}

// schema appends s, in a record of namespace space ("" none).
func (w *avroWriter) schema(s *ConnectSchema, space string) error {
	if s.Required {
		_, err := w.base(s, space)
		return err
	}
	w.b = append(w.b, `["null",`...)
	if _, err := w.base(s, space); err != nil {
		return err
	}
	w.b = append(w.b, ']')
	return nil
}

// base appends s without its optionality and returns the name that a
// union knows it by.
func (w *avroWriter) base(s *ConnectSchema, space string) (string, error) {
	var prim string
	switch s.Type {
	case "int16":
		// AvroData marks a Connect int16 on Avro's int.
		w.b = append(w.b, `{"type":"int","connect.type":"int16"}`...)
		return "int", nil
	case "int32":
		prim = "int"
	case "int64":
		prim = "long"
	case "double":
		prim = "double"
	case "boolean":
		prim = "boolean"
	case "string":
		prim = "string"
	case "bytes":
		prim = "bytes"
	case "array":
		w.b = append(w.b, `{"type":"array","items":`...)
		if err := w.schema(s.Items, space); err != nil {
			return "", err
		}
		w.b = append(w.b, '}')
		return "array", nil
	case "struct":
		return w.record(s, space)
	default:
		return "", fmt.Errorf("connect type %q has no Avro schema here", s.Type)
	}
	if s.Name == "" && s.Version == 0 {
		w.b = strconv.AppendQuote(w.b, prim)
		return prim, nil
	}
	w.b = append(w.b, `{"type":`...)
	w.b = strconv.AppendQuote(w.b, prim)
	if s.Version != 0 {
		w.b = append(w.b, `,"connect.version":`...)
		w.b = strconv.AppendInt(w.b, int64(s.Version), 10)
	}
	if s.Name != "" {
		w.b = append(w.b, `,"connect.name":`...)
		w.b = jsonString(w.b, s.Name)
	}
	w.b = append(w.b, '}')
	return prim, nil
}

func (w *avroWriter) record(s *ConnectSchema, space string) (string, error) {
	ns, name := "", s.Name
	if s.Name == "" {
		w.defaults++
		ns, name = defaultNamespace, defaultName
		if w.defaults > 1 {
			name += strconv.Itoa(w.defaults)
		}
	} else if i := strings.LastIndexByte(s.Name, '.'); i >= 0 {
		ns, name = s.Name[:i], s.Name[i+1:]
	}
	if !avroName(name) {
		return "", fmt.Errorf("record %q: %w", s.Name, ErrAvroName)
	}
	if ns != "" {
		for p := range strings.SplitSeq(ns, ".") {
			if !avroName(p) {
				return "", fmt.Errorf("record %q: namespace %q: %w", s.Name, ns, ErrAvroName)
			}
		}
	}
	w.b = append(w.b, `{"type":"record","name":`...)
	w.b = jsonString(w.b, name)
	if ns != space {
		w.b = append(w.b, `,"namespace":`...)
		w.b = jsonString(w.b, ns)
	}
	w.b = append(w.b, `,"fields":[`...)
	for i, f := range s.Fields {
		if !avroName(f.Name) {
			return "", fmt.Errorf("field %q of %q: %w", f.Name, s.Name, ErrAvroName)
		}
		if w.max > 0 && len(w.b) > w.max {
			return "", errSchemaSize
		}
		if i > 0 {
			w.b = append(w.b, ',')
		}
		w.b = append(w.b, `{"name":`...)
		w.b = jsonString(w.b, f.Name)
		w.b = append(w.b, `,"type":`...)
		if err := w.schema(f.Schema, ns); err != nil {
			return "", err
		}
		if !f.Schema.Required {
			w.b = append(w.b, `,"default":null`...)
		}
		w.b = append(w.b, '}')
	}
	w.b = append(w.b, ']')
	if s.Name != "" {
		w.b = append(w.b, `,"connect.name":`...)
		w.b = jsonString(w.b, s.Name)
	}
	w.b = append(w.b, '}')
	if ns == "" {
		return name, nil
	}
	return ns + "." + name, nil
}

// jsonString appends s as a JSON string as Jackson writes one (what is
// written here is Avro names and the Connect names they were split from:
// letters, digits, underscores and dots, non-ASCII ones as they are, in
// UTF-8, as Jackson writes them).
func jsonString(dst []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

func pathOr(p string) string {
	if p == "" {
		return "the value"
	}
	return p
}

func kindName(k Kind) string {
	switch k {
	case KindNull:
		return "null"
	case KindBool:
		return "boolean"
	case KindString:
		return "string"
	case KindArray:
		return "array"
	case KindObject:
		return "object"
	case KindFloat64:
		return "fractional number"
	}
	return "integer"
}

// DecodeAvro decodes body, a value in Avro's binary encoding of the schema
// text, into plain Go values: a record a map by field name, an array a
// slice, a union its branch's value (nil for null), int int32 and long
// int64 (as hamba/avro decodes them into any: int and int64), double
// float64, bytes []byte.
func DecodeAvro(schema string, body []byte) (any, error) {
	s, err := avro.ParseWithCache(schema, "", &avro.SchemaCache{})
	if err != nil {
		return nil, fmt.Errorf("parse the Avro schema: %w", err)
	}
	return DecodeAvroWith(AvroDecodeConfig(), s, body) // nothing kept past the call
}

// unwrap takes the union wrappers ({"name": value}) off a value that
// hamba/avro decoded into any, walking its schema.
func unwrap(s avro.Schema, v any) any {
	switch x := s.(type) {
	case *avro.UnionSchema:
		m, ok := v.(map[string]any)
		if !ok || len(m) != 1 {
			return v // nil: null
		}
		for name, u := range m {
			for _, t := range x.Types() {
				if unionName(t) == name {
					return unwrap(t, u)
				}
			}
		}
		return v
	case *avro.RecordSchema:
		m, ok := v.(map[string]any)
		if !ok {
			return v
		}
		for _, f := range x.Fields() {
			if u, ok := m[f.Name()]; ok {
				m[f.Name()] = unwrap(f.Type(), u)
			}
		}
		return m
	case *avro.ArraySchema:
		a, ok := v.([]any)
		if !ok {
			return v
		}
		for i, u := range a {
			a[i] = unwrap(x.Items(), u)
		}
		return a
	}
	return v
}

// unionName is how hamba/avro keys a union's branch: a named type's full
// name, else its type.
func unionName(s avro.Schema) string {
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	return string(s.Type())
}
