package format

import (
	"errors"
	"fmt"
	"math"
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
// as the converter registers it, and the parsed schema that encodes
// values.
type AvroSchema struct {
	Text   string
	schema avro.Schema
	// unions names the non-null branch of each optional (union) schema met
	// while translating, by Connect schema, as a generic union value is
	// keyed (hamba/avro: the type's full name, or array, or a primitive's).
	unions map[*ConnectSchema]string
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

// Avro translates s into its Avro schema.
func Avro(s *ConnectSchema) (*AvroSchema, error) {
	return translate(s, func(text []byte) (avro.Schema, error) {
		return avro.ParseBytesWithCache(text, "", &avro.SchemaCache{}) // a cache of its own: payloads name their records alike
	})
}

// translate translates s, the schema's text parsed by parse.
func translate(s *ConnectSchema, parse func([]byte) (avro.Schema, error)) (*AvroSchema, error) {
	w := &avroWriter{unions: map[*ConnectSchema]string{}}
	if err := w.schema(s, ""); err != nil {
		return nil, err
	}
	parsed, err := parse(w.b)
	if err != nil {
		return nil, fmt.Errorf("the Avro schema of the payload: %w", err)
	}
	return &AvroSchema{Text: string(w.b), schema: parsed, unions: w.unions}, nil
}

type avroWriter struct {
	b        []byte
	defaults int // records named ConnectDefault so far
	unions   map[*ConnectSchema]string
}

// schema appends s, in a record of namespace space ("" none).
func (w *avroWriter) schema(s *ConnectSchema, space string) error {
	if s.Required {
		_, err := w.base(s, space)
		return err
	}
	w.b = append(w.b, `["null",`...)
	name, err := w.base(s, space)
	if err != nil {
		return err
	}
	w.unions[s] = name
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

// javaAvro encodes as Avro's Java library does (GenericDatumWriter with a
// BinaryEncoder): an array as one block of all its items, its count
// without a byte size, then 0.
var javaAvro = avro.Config{BlockLength: math.MaxInt32, DisableBlockSizeHeader: true}.Freeze()

// EncodeAvro writes n, a value of the Connect schema s that a translated
// into, in Avro's binary encoding (without framing).
func (a *AvroSchema) EncodeAvro(s *ConnectSchema, n *Node) ([]byte, error) {
	v, err := a.value(s, n, "")
	if err != nil {
		return nil, err
	}
	b, err := javaAvro.Marshal(a.schema, v)
	if err != nil {
		return nil, fmt.Errorf("encode in Avro: %w", err)
	}
	return b, nil
}

// value is n as hamba/avro's generic encoding takes a value of s: a record
// a map by field name, an array a slice, an optional value's non-null
// branch a one-entry map keyed by the branch's name.
func (a *AvroSchema) value(s *ConnectSchema, n *Node, path string) (any, error) {
	if n == nil || n.Kind == KindNull {
		if s.Required {
			return nil, fmt.Errorf("%s: null in a required %s", pathOr(path), s.Type)
		}
		return nil, nil
	}
	v, err := a.base(s, n, path)
	if err != nil || s.Required {
		return v, err
	}
	return map[string]any{a.unions[s]: v}, nil
}

func (a *AvroSchema) base(s *ConnectSchema, n *Node, path string) (any, error) {
	mismatch := func() error {
		return fmt.Errorf("%s: a JSON %s in a field of type %s", pathOr(path), kindName(n.Kind), s.Type)
	}
	switch s.Type {
	case "string":
		if n.Kind != KindString {
			return nil, mismatch()
		}
		return n.Text, nil
	case "bytes":
		if n.Kind != KindString {
			return nil, mismatch()
		}
		return []byte(n.Text), nil
	case "boolean":
		if n.Kind != KindBool {
			return nil, mismatch()
		}
		return n.Bool, nil
	case "int16":
		v, err := strconv.ParseInt(n.Text, 10, 64)
		if n.Kind != KindInt32 || err != nil || v < math.MinInt16 || v > math.MaxInt16 {
			return nil, mismatch()
		}
		return int32(v), nil
	case "int32", "int64":
		// An int64 schema takes only a literal beyond 32 bits (Jackson's
		// LongNode): Connect refuses an Integer in it. (Only a merge of
		// objects of differing fields gives one a smaller literal.)
		if n.Kind != KindInt32 && n.Kind != KindInt64 || s.Type == "int64" && n.Kind != KindInt64 {
			return nil, mismatch()
		}
		v, err := strconv.ParseInt(n.Text, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", pathOr(path), err)
		}
		if s.Type == "int32" {
			if v < math.MinInt32 || v > math.MaxInt32 {
				return nil, mismatch()
			}
			return int32(v), nil
		}
		return v, nil
	case "double":
		switch n.Kind {
		case KindFloat64:
			f, err := strconv.ParseFloat(n.Text, 64)
			if errors.Is(err, strconv.ErrRange) {
				// Beyond a double's range: ±Inf (or 0), as Jackson's
				// DoubleNode reads it and Debezium writes it.
				err = nil
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", pathOr(path), err)
			}
			return f, nil
		case KindBigInt:
			// Jackson's BigIntegerNode in a double schema: Connect's
			// converter fails on it (a BigInteger is no Double).
			return nil, fmt.Errorf("%s: the integer %s is beyond 64 bits, which Debezium's converter cannot write as a double", pathOr(path), n.Text)
		}
		return nil, mismatch()
	case "array":
		if n.Kind != KindArray {
			return nil, mismatch()
		}
		out := make([]any, len(n.Elems))
		for i, e := range n.Elems {
			v, err := a.value(s.Items, e, path+"["+strconv.Itoa(i)+"]")
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case "struct":
		if n.Kind != KindObject {
			return nil, mismatch()
		}
		out := make(map[string]any, len(s.Fields))
		for _, f := range s.Fields {
			p := f.Name
			if path != "" {
				p = path + "." + f.Name
			}
			v, err := a.value(f.Schema, n.Field(f.Name), p)
			if err != nil {
				return nil, err
			}
			out[f.Name] = v
		}
		return out, nil
	}
	return nil, fmt.Errorf("connect type %q has no Avro encoding here", s.Type)
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
	var v any
	if err := avro.Unmarshal(s, body, &v); err != nil {
		return nil, fmt.Errorf("decode in Avro: %w", err)
	}
	return unwrap(s, v), nil
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
