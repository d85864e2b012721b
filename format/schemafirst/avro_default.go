package schemafirst

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/hamba/avro/v2"
)

// Record fields' defaults in a compiled Avro schema: encoded once, and
// written where a payload lacks the field.

// Bounds of the defaults' encodings kept with a compiled schema: a
// default is written from its encoding, computed once; a default whose
// encoding is larger than maxDefaultBytes, or than what remains of
// maxDefaultsBytes for the schema, is written from its JSON each time it
// is used (within the value's running bound). A schema nesting records
// of many fields with defaults of {} has defaults whose encoding grows
// with the power of its depth.
const (
	maxDefaultBytes  = 64 << 10
	maxDefaultsBytes = 1 << 20
	// maxDefaultDepth bounds the defaults written from their JSON inside
	// one another (a default of a record whose missing field's default
	// is of that record again).
	maxDefaultDepth = 32
)

// avroDefault is a record field's default in a compiled schema: its
// encoding, or why it cannot be written (field: where in the default,
// after the field's own path), or neither and fromValue: written from its
// JSON each time.
type avroDefault struct {
	bytes         []byte
	field, reason string
	fromValue     bool
}

// avroDefaults computes the defaults of every record field of s that
// has one.
func avroDefaults(s avro.Schema) map[*avro.Field]*avroDefault {
	w := &jsonAvroWriter{defaults: map[*avro.Field]*avroDefault{}, memo: true}
	var fields []*avro.Field
	seen := map[avro.Schema]bool{}
	var walk func(s avro.Schema)
	walk = func(s avro.Schema) {
		if r, ok := s.(*avro.RefSchema); ok {
			s = r.Schema()
		}
		if seen[s] {
			return
		}
		seen[s] = true
		switch x := s.(type) {
		case *avro.RecordSchema:
			for _, f := range x.Fields() {
				if f.HasDefault() {
					fields = append(fields, f)
				}
				walk(f.Type())
			}
		case *avro.ArraySchema:
			walk(x.Items())
		case *avro.MapSchema:
			walk(x.Values())
		case *avro.UnionSchema:
			for _, t := range x.Types() {
				walk(t)
			}
		}
	}
	walk(s)
	for _, f := range fields {
		w.defaultOf(f)
	}
	return w.defaults
}

// defaultOf returns f's default: kept, or (compiling) computed and kept.
func (w *jsonAvroWriter) defaultOf(f *avro.Field) *avroDefault {
	if d, ok := w.defaults[f]; ok {
		return d
	}
	if !w.memo {
		return &avroDefault{fromValue: true} // not met compiling: not kept (read only)
	}
	d := &avroDefault{reason: fmt.Sprintf("the default of %s is of the record it is a default in, again", f.Name())}
	w.defaults[f] = d // while it is computed: a default met again inside it
	v := f.Default()
	dw := &jsonAvroWriter{max: min(maxDefaultBytes, maxDefaultsBytes-w.kept), defaults: w.defaults, memo: true, kept: w.kept}
	if dw.max <= 0 {
		*d = avroDefault{fromValue: true}
		return d
	}
	field, reason := dw.write(f.Type(), v, true)
	switch {
	case dw.over:
		*d = avroDefault{fromValue: true}
	case reason != "":
		*d = avroDefault{field: field, reason: reason}
	default:
		*d = avroDefault{bytes: dw.buf}
		w.kept = dw.kept + len(dw.buf)
	}
	return d
}

// defaultLeaf is a value of a default as hamba/avro parsed it (and
// filled in a record's missing fields' defaults, sharing them: converting
// the whole to JSON first expanded what it shares, a power of the
// schema's depth) as decodeJSON reads it: a number a json.Number, bytes
// and a fixed's array the string of their code points (Avro's JSON
// encoding of bytes), hamba/avro's null its nil. Maps and arrays are
// converted as they are written.
func defaultLeaf(v any) any {
	switch x := v.(type) {
	case nil, bool, string, json.Number, map[string]any, []any:
		return v
	case int:
		return json.Number(strconv.Itoa(x))
	case int32:
		return json.Number(strconv.FormatInt(int64(x), 10))
	case int64:
		return json.Number(strconv.FormatInt(x, 10))
	case float32:
		return json.Number(strconv.FormatFloat(float64(x), 'g', -1, 32))
	case float64:
		return json.Number(strconv.FormatFloat(x, 'g', -1, 64))
	case []byte:
		return codePoints(x)
	case json.Marshaler: // hamba/avro's null
		if b, err := x.MarshalJSON(); err == nil && string(b) == "null" {
			return nil
		}
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Array && rv.Type().Elem().Kind() == reflect.Uint8 {
		b := make([]byte, rv.Len())
		reflect.Copy(reflect.ValueOf(b), rv)
		return codePoints(b)
	}
	return v
}

// codePoints is bytes in Avro's JSON encoding: each byte a code point.
func codePoints(b []byte) string {
	var s strings.Builder
	for _, c := range b {
		s.WriteRune(rune(c))
	}
	return s.String()
}
