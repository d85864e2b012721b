package record

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/format"
)

// Expanding a JSON payload as Debezium's EventRouter does with
// table.expand.json.payload=true: a payload whose text starts with { or [
// is parsed, a Kafka Connect schema is inferred from it (JsonSchemaData,
// with the default null and empty-array behaviours: such fields are left
// out), and the JsonConverter writes the value, and in json_schema the
// inferred schema, instead of a string of the text. A payload Debezium
// cannot infer a schema for (an array of mixed types or number kinds, an
// array of nulls only, text that does not parse) stays the string it was.

// appendSchema appends s as the JsonConverter writes a schema, with the
// "field" name of a struct's field last.
func appendSchema(dst []byte, s *format.ConnectSchema, field string, limit int) []byte {
	dst = append(dst, `{"type":"`...)
	dst = append(dst, s.Type...)
	dst = append(dst, '"')
	switch s.Type {
	case "array":
		dst = append(dst, `,"items":`...)
		dst = appendSchema(dst, s.Items, "", limit)
	case "struct":
		dst = append(dst, `,"fields":[`...)
		for i, f := range s.Fields {
			if limit > 0 && len(dst) > limit {
				return dst // over: expandJSON refuses it
			}
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendSchema(dst, f.Schema, f.Name, limit)
		}
		dst = append(dst, ']')
	}
	// Every inferred schema is optional but an array's items merged from
	// objects of differing fields (JsonSchemaData.mergeSchema), which the
	// JsonConverter writes "optional":false.
	if s.Required {
		dst = append(dst, `,"optional":false`...)
	} else {
		dst = append(dst, `,"optional":true`...)
	}
	if s.Name != "" {
		dst = append(dst, `,"name":`...)
		dst = jacksonQuote(dst, []byte(s.Name))
	}
	if field != "" {
		dst = append(dst, `,"field":`...)
		dst = jacksonQuote(dst, []byte(field))
	}
	return append(dst, '}')
}

// appendValue appends n as the JsonConverter writes it in schema s: a
// struct's fields in the schema's order, one the value lacks as null.
func appendValue(dst []byte, n *format.Node, s *format.ConnectSchema, limit int) []byte {
	if n == nil || n.Kind == format.KindNull {
		return append(dst, "null"...)
	}
	switch n.Kind {
	case format.KindBool:
		return strconv.AppendBool(dst, n.Bool)
	case format.KindString:
		return jacksonQuote(dst, []byte(n.Text))
	case format.KindInt32, format.KindInt64:
		v, _ := strconv.ParseInt(n.Text, 10, 64)
		return strconv.AppendInt(dst, v, 10)
	case format.KindBigInt:
		// Debezium's converter fails on it (a BigDecimal in a float64
		// schema); walrelay keeps the literal.
		return append(dst, n.Text...)
	case format.KindFloat64:
		f, _ := strconv.ParseFloat(n.Text, 64)
		return appendJavaDouble(dst, f)
	case format.KindArray:
		var items *format.ConnectSchema
		if s != nil {
			items = s.Items
		}
		dst = append(dst, '[')
		for i, e := range n.Elems {
			if limit > 0 && len(dst) > limit {
				return dst // over: expandJSON refuses it
			}
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendValue(dst, e, items, limit)
		}
		return append(dst, ']')
	}
	dst = append(dst, '{')
	if s == nil {
		s = &format.ConnectSchema{}
	}
	for i, f := range s.Fields {
		if limit > 0 && len(dst) > limit {
			return dst // over: expandJSON refuses it
		}
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = jacksonQuote(dst, []byte(f.Name))
		dst = append(dst, ':')
		dst = appendValue(dst, n.Field(f.Name), f.Schema, limit)
	}
	return append(dst, '}')
}

// appendJavaDouble appends f as Java's Double.toString writes it (the
// shortest digits, at least two, that read back as f, as Java 19 and
// later choose them):
// a decimal with at least one fraction digit from 10^-3 up to 10^7,
// scientific notation (1.0E7, 1.5E-4) outside; Jackson writes a non-finite
// double as a string.
func appendJavaDouble(dst []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(dst, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(dst, `"-Infinity"`...)
	}
	if math.Signbit(f) {
		dst = append(dst, '-')
		f = -f
	}
	if f == 0 {
		return append(dst, "0.0"...)
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±x
	if !strings.Contains(e, ".") {
		// Java writes at least two digits, the two closest to f (4.9E-324,
		// not 5.0E-324).
		e = strconv.FormatFloat(f, 'e', 1, 64)
	}
	mant, exps, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(exps)
	digits := strings.TrimRight(strings.Replace(mant, ".", "", 1), "0")
	if digits == "" {
		digits = "0"
	}
	if f >= 1e-3 && f < 1e7 {
		if exp >= 0 {
			for len(digits) < exp+2 {
				digits += "0"
			}
			return append(append(append(dst, digits[:exp+1]...), '.'), digits[exp+1:]...)
		}
		dst = append(dst, "0."...)
		dst = append(dst, strings.Repeat("0", -exp-1)...)
		return append(dst, digits...)
	}
	if len(digits) == 1 {
		digits += "0"
	}
	dst = append(append(append(dst, digits[0], '.'), digits[1:]...), 'E')
	return strconv.AppendInt(dst, int64(exp), 10)
}

// expandJSON returns the expanded value of a payload (and, for
// FormatJSONSchema, the envelope with its inferred schema, named by the
// payload column), and false where Debezium leaves the payload a string.
func (f Format) expandJSON(payload []byte, column string) ([]byte, bool) {
	out, ok, _ := f.expandWithin(payload, column, 0)
	return out, ok
}

// ErrExpandedTooLarge is an expanded value over the record cap
// (Encode's maxBytes).
var ErrExpandedTooLarge = errors.New("the expanded payload is larger than a record can be")

// expandWithin is expandJSON, writing at most about maxBytes (0 no bound):
// past it, the writing stops and the error is ErrExpandedTooLarge. An
// array of E objects, each with keys of its own, is written with about
// E×E nulls (the fields of the merged record each lacks), so that a
// payload of 200 KB would expand to gigabytes.
func (f Format) expandWithin(payload []byte, column string, maxBytes int) ([]byte, bool, error) {
	if len(payload) == 0 || (payload[0] != '{' && payload[0] != '[') {
		return nil, false, nil
	}
	n, err := format.ParseJSON(payload)
	if err != nil {
		return nil, false, nil
	}
	s, err := format.InferSchema(column, n)
	if err != nil || s == nil {
		return nil, false, nil
	}
	out := make([]byte, 0, len(payload)+64)
	if f == FormatJSONSchema {
		out = append(out, `{"schema":`...)
		out = appendSchema(out, s, "", maxBytes)
		out = append(out, `,"payload":`...)
	}
	if maxBytes <= 0 || len(out) <= maxBytes {
		out = appendValue(out, n, s, maxBytes)
	}
	if maxBytes > 0 && len(out) > maxBytes {
		return nil, false, fmt.Errorf("%w: %s: more than the %d bytes of a record to the topic (stopped writing it there)", ErrExpandedTooLarge, f, maxBytes)
	}
	if f == FormatJSONSchema {
		out = append(out, '}')
	}
	return out, true, nil
}

// expand is the expanded value of e's payload, if the configuration
// expands JSON payloads and Debezium would expand this one; an error
// (ErrExpandedTooLarge) if it is larger than maxBytes (0: no bound), the
// topic's batch cap, which the client would refuse anyway: it is not
// written past it. A value
// nesting deeper than Jackson writes (format.MaxNestingDepth: a
// json_schema envelope of a payload of 500 nested objects) is another
// error: Debezium's JsonConverter fails on it ("Converting Kafka Connect
// data to byte[] failed due to serialization error") and its task stops.
func (b *Builder) expand(e *event.Event, maxBytes int) ([]byte, bool, error) {
	if !b.cfg.ExpandJSONPayload || e.Payload == nil {
		return nil, false, nil
	}
	v, ok, err := b.cfg.ValueFormat.expandWithin(e.Payload, e.PayloadColumn, maxBytes)
	if err == nil && ok {
		if d := format.Nesting(v); d > format.MaxNestingDepth {
			return nil, false, fmt.Errorf("the expanded payload nests %d deep in %s, more than the %d that Jackson writes (Debezium's converter fails on it)", d, b.cfg.ValueFormat, format.MaxNestingDepth)
		}
	}
	return v, ok, err
}
