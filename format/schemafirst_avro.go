package format

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"github.com/hamba/avro/v2"
)

// ParseAvro parses an Avro schema of the registry with the schemas it
// references (as References gives them, each after those it references
// itself): their named types are parsed first, into the cache the schema
// is parsed with.
func ParseAvro(text string, refs []Reference) (avro.Schema, error) {
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
	if err := avroNames(schema, map[avro.Schema]bool{}); err != nil {
		return nil, fmt.Errorf("parse the Avro schema: %w", err)
	}
	if err := avroDecimals(schema, map[avro.Schema]bool{}); err != nil {
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
// no Java consumer reads it. The error is ErrAvroName.
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

// compileAvro parses an Avro schema of the registry (ParseAvro) and
// returns the writer of JSON payloads in it: the JSON converted, by the
// schema, into the values github.com/hamba/avro/v2 writes.
func compileAvro(text string, refs []Reference, mismatch func(field, reason string) *MismatchError) (func(dst, payload []byte) ([]byte, *MismatchError), error) {
	schema, err := ParseAvro(text, refs)
	if err != nil {
		return nil, err
	}
	return func(dst, payload []byte) ([]byte, *MismatchError) {
		v, err := decodeJSON(payload)
		if err != nil {
			return nil, mismatch("", err.Error())
		}
		native, field, reason := avroNative(schema, v, "", false)
		if reason != "" {
			return nil, mismatch(field, reason)
		}
		body, err := avro.Marshal(schema, native)
		if err != nil {
			return nil, mismatch("", err.Error())
		}
		return append(dst, body...), nil
	}, nil
}

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
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

// avroNative converts the JSON value v at path (a JSON pointer) into what
// hamba/avro writes in schema s: records and maps as map[string]any (a
// record's missing fields given their defaults), a union's value as a
// one-entry map naming its branch, a logical type's value as its
// underlying type's (avroLogical). A value that does not fit returns the
// field and the reason. With avroJSON, v is in Avro's own JSON encoding
// (a field's default): a logical type's value is its underlying type's.
func avroNative(s avro.Schema, v any, path string, avroJSON bool) (out any, field, reason string) {
	want := func() (any, string, string) {
		return nil, path, fmt.Sprintf("want %s, got %s", avroTypeName(s), jsonType(v))
	}
	if ls, ok := s.(avro.LogicalTypeSchema); ok && ls.Logical() != nil && !avroJSON {
		return avroLogical(s, ls.Logical(), v, path)
	}
	switch s.Type() {
	case avro.Ref:
		return avroNative(s.(*avro.RefSchema).Schema(), v, path, avroJSON)
	case avro.Null:
		if v != nil {
			return want()
		}
		return nil, "", ""
	case avro.Boolean:
		if b, ok := v.(bool); ok {
			return b, "", ""
		}
		return want()
	case avro.Int, avro.Long:
		n, ok := v.(json.Number)
		if !ok {
			return want()
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil {
			return nil, path, fmt.Sprintf("want %s, got %s", avroTypeName(s), n)
		}
		if s.Type() == avro.Int {
			if int64(int32(i)) != i {
				return nil, path, fmt.Sprintf("%d is out of an int's range", i)
			}
			return int32(i), "", ""
		}
		return i, "", ""
	case avro.Float, avro.Double:
		n, ok := v.(json.Number)
		if !ok {
			return want()
		}
		f, err := strconv.ParseFloat(string(n), 64)
		if err != nil {
			return nil, path, fmt.Sprintf("%s is out of a %s's range", n, s.Type())
		}
		if s.Type() == avro.Float {
			if math.IsInf(float64(float32(f)), 0) {
				// Beyond a float32's range: Avro's float would be an
				// infinity, which the JSON did not say.
				return nil, path, fmt.Sprintf("%s is out of a float's range", n)
			}
			return float32(f), "", ""
		}
		return f, "", ""
	case avro.String:
		if str, ok := v.(string); ok {
			return str, "", ""
		}
		return want()
	case avro.Bytes:
		str, ok := v.(string)
		if !ok {
			return want()
		}
		b, ok := latin1(str)
		if !ok {
			return nil, path, "want bytes (a string of code points up to U+00FF, as Avro's JSON encoding writes them)"
		}
		return b, "", ""
	case avro.Fixed:
		fs := s.(*avro.FixedSchema)
		str, ok := v.(string)
		if !ok {
			return want()
		}
		b, ok := latin1(str)
		if !ok || len(b) != fs.Size() {
			return nil, path, fmt.Sprintf("want %d bytes of the fixed %s", fs.Size(), fs.FullName())
		}
		a := reflect.New(reflect.ArrayOf(fs.Size(), reflect.TypeFor[byte]())).Elem()
		reflect.Copy(a, reflect.ValueOf(b))
		return a.Interface(), "", ""
	case avro.Enum:
		es := s.(*avro.EnumSchema)
		str, ok := v.(string)
		if !ok {
			return want()
		}
		for _, sym := range es.Symbols() {
			if sym == str {
				return str, "", ""
			}
		}
		return nil, path, fmt.Sprintf("%q is not a symbol of the enum %s (%s)", str, es.FullName(), strings.Join(es.Symbols(), ", "))
	case avro.Array:
		a, ok := v.([]any)
		if !ok {
			return want()
		}
		items := s.(*avro.ArraySchema).Items()
		out := make([]any, len(a))
		for i, e := range a {
			n, f, r := avroNative(items, e, path+"/"+strconv.Itoa(i), avroJSON)
			if r != "" {
				return nil, f, r
			}
			out[i] = n
		}
		return out, "", ""
	case avro.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return want()
		}
		values := s.(*avro.MapSchema).Values()
		out := make(map[string]any, len(m))
		for k, e := range m {
			n, f, r := avroNative(values, e, path+"/"+pointerToken(k), avroJSON)
			if r != "" {
				return nil, f, r
			}
			out[k] = n
		}
		return out, "", ""
	case avro.Record:
		rs := s.(*avro.RecordSchema)
		m, ok := v.(map[string]any)
		if !ok {
			return want()
		}
		out := make(map[string]any, len(rs.Fields()))
		for _, f := range rs.Fields() {
			fp := path + "/" + pointerToken(f.Name())
			e, present := m[f.Name()]
			fromDefault := avroJSON
			if !present {
				fromDefault = true
				if !f.HasDefault() {
					return nil, fp, fmt.Sprintf("missing: the field %s of the record %s is required (it has no default)", f.Name(), rs.FullName())
				}
				d, err := defaultJSON(f.Default())
				if err != nil {
					return nil, fp, fmt.Sprintf("the default of %s: %v", f.Name(), err)
				}
				e = d
			}
			n, ff, r := avroNative(f.Type(), e, fp, fromDefault)
			if r != "" {
				return nil, ff, r
			}
			out[f.Name()] = n
		}
		for k := range m {
			if !hasField(rs, k) {
				return nil, path + "/" + pointerToken(k), fmt.Sprintf("the record %s has no field %s", rs.FullName(), k)
			}
		}
		return out, "", ""
	case avro.Union:
		us := s.(*avro.UnionSchema)
		if v == nil {
			for _, b := range us.Types() {
				if b.Type() == avro.Null {
					return map[string]any{}, "", ""
				}
			}
		}
		var reasons []string
		for _, b := range us.Types() {
			if b.Type() == avro.Null {
				continue
			}
			n, _, r := avroNative(b, v, path, avroJSON)
			if r == "" {
				return map[string]any{branchName(b): n}, "", ""
			}
			reasons = append(reasons, r)
		}
		// Avro's own JSON encoding of a union: {"<branch>": value}.
		if m, ok := v.(map[string]any); ok && len(m) == 1 {
			for k, e := range m {
				for _, b := range us.Types() {
					if branchName(b) == k {
						n, f, r := avroNative(b, e, path+"/"+pointerToken(k), avroJSON)
						if r != "" {
							return nil, f, r
						}
						return map[string]any{k: n}, "", ""
					}
				}
			}
		}
		return nil, path, fmt.Sprintf("fits none of the union's types (%s): %s", avroTypeName(s), strings.Join(reasons, "; "))
	}
	return nil, path, fmt.Sprintf("the Avro type %s is not supported", s.Type())
}

func hasField(rs *avro.RecordSchema, name string) bool {
	for _, f := range rs.Fields() {
		if f.Name() == name {
			return true
		}
	}
	return false
}

// defaultJSON is a field's default as JSON decodes it (numbers as
// json.Number), whatever Go type the schema parser gave it.
func defaultJSON(d any) (any, error) {
	if d == nil {
		return nil, nil
	}
	if b, ok := d.([]byte); ok {
		return string(b), nil
	}
	b, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	return decodeJSON(b)
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
