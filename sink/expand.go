package sink

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/walrelay/walrelay/event"
)

// Expanding a JSON payload as Debezium's EventRouter does with
// table.expand.json.payload=true: a payload whose text starts with { or [
// is parsed, a Kafka Connect schema is inferred from it (JsonSchemaData,
// with the default null and empty-array behaviours: such fields are left
// out), and the JsonConverter writes the value, and in json_schema the
// inferred schema, instead of a string of the text. A payload Debezium
// cannot infer a schema for (an array of mixed types or number kinds, an
// array of nulls only, text that does not parse) stays the string it was.

// jkind is the kind of a parsed JSON value, with Jackson's number kinds.
type jkind uint8

const (
	jNull jkind = iota
	jBool
	jString
	jInt32   // an integer literal that fits an int (IntNode)
	jInt64   // one that fits a long (LongNode)
	jBigInt  // a longer one (BigIntegerNode)
	jFloat64 // a literal with a fraction or exponent (DoubleNode)
	jArray
	jObject
)

// jnode is a parsed JSON value; an object keeps its keys in document order
// (a repeated key keeps its first place and its last value, as Jackson's
// ObjectNode).
type jnode struct {
	kind  jkind
	text  string // a string's value, a number's literal
	b     bool
	keys  []string
	elems []*jnode // an object's values (by keys) or an array's elements
}

// field returns the value of an object's key, nil if it has none.
func (n *jnode) field(k string) *jnode {
	for i, x := range n.keys {
		if x == k {
			return n.elems[i]
		}
	}
	return nil
}

// parseJSON parses one JSON value from text; what follows it is ignored, as
// Jackson's readTree ignores it.
func parseJSON(text []byte) (*jnode, error) {
	d := json.NewDecoder(bytes.NewReader(text))
	d.UseNumber()
	return parseValue(d)
}

func parseValue(d *json.Decoder) (*jnode, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch v := tok.(type) {
	case nil:
		return &jnode{kind: jNull}, nil
	case bool:
		return &jnode{kind: jBool, b: v}, nil
	case string:
		return &jnode{kind: jString, text: v}, nil
	case json.Number:
		return &jnode{kind: numberKind(string(v)), text: string(v)}, nil
	case json.Delim:
		n := &jnode{kind: jArray}
		if v == '{' {
			n.kind = jObject
		}
		for d.More() {
			key := ""
			if n.kind == jObject {
				t, err := d.Token()
				if err != nil {
					return nil, err
				}
				key, _ = t.(string)
			}
			x, err := parseValue(d)
			if err != nil {
				return nil, err
			}
			if n.kind == jObject {
				if i := indexOf(n.keys, key); i >= 0 {
					n.elems[i] = x
					continue
				}
				n.keys = append(n.keys, key)
			}
			n.elems = append(n.elems, x)
		}
		if _, err := d.Token(); err != nil { // the closing delimiter
			return nil, err
		}
		return n, nil
	}
	return nil, errors.New("unexpected JSON token")
}

func indexOf(keys []string, k string) int {
	for i, x := range keys {
		if x == k {
			return i
		}
	}
	return -1
}

// numberKind is the node Jackson makes of a number literal.
func numberKind(lit string) jkind {
	if strings.ContainsAny(lit, ".eE") {
		return jFloat64
	}
	v, err := strconv.ParseInt(lit, 10, 64)
	switch {
	case err != nil:
		return jBigInt
	case v >= math.MinInt32 && v <= math.MaxInt32:
		return jInt32
	}
	return jInt64
}

// cschema is an inferred Kafka Connect schema (every one optional).
type cschema struct {
	typ    string // as the JsonConverter names it: int32, int64, double, boolean, string, array, struct
	name   string // a struct's name; "" none
	items  *cschema
	fields []cfield
}

type cfield struct {
	name   string
	schema *cschema
}

func (s *cschema) field(name string) *cschema {
	for _, f := range s.fields {
		if f.name == name {
			return f.schema
		}
	}
	return nil
}

// equal compares two schemas as Connect's ConnectSchema.equals does.
func (s *cschema) equal(o *cschema) bool {
	if s == nil || o == nil {
		return s == o
	}
	if s.typ != o.typ || s.name != o.name || len(s.fields) != len(o.fields) || !s.items.equal(o.items) {
		return false
	}
	for i, f := range s.fields {
		if f.name != o.fields[i].name || !f.schema.equal(o.fields[i].schema) {
			return false
		}
	}
	return true
}

var errNoSchema = errors.New("no schema can be inferred")

// inferSchema is JsonSchemaData.toConnectSchema: nil for a value it leaves
// out (a null, an empty array), an error where Debezium's expansion fails.
func inferSchema(key string, n *jnode) (*cschema, error) {
	switch n.kind {
	case jString:
		return &cschema{typ: "string"}, nil
	case jBool:
		return &cschema{typ: "boolean"}, nil
	case jInt32:
		return &cschema{typ: "int32"}, nil
	case jInt64:
		return &cschema{typ: "int64"}, nil
	case jBigInt, jFloat64:
		return &cschema{typ: "double"}, nil
	case jArray:
		if len(n.elems) == 0 {
			return nil, nil
		}
		items, err := itemSchema(key, n)
		if err != nil {
			return nil, err
		}
		return &cschema{typ: "array", items: items}, nil
	case jObject:
		s := &cschema{typ: "struct", name: key}
		for i, k := range n.keys {
			fk := k
			if key != "" {
				fk = key + "." + k
			}
			fs, err := inferSchema(fk, n.elems[i])
			if err != nil {
				return nil, err
			}
			if fs != nil {
				s.fields = append(s.fields, cfield{k, fs})
			}
		}
		return s, nil
	}
	return nil, nil
}

// itemSchema is the schema of an array's elements: the first non-null
// element's, all of one node type (and number kind); for objects, their
// distinct schemas merged.
func itemSchema(key string, n *jnode) (*cschema, error) {
	var first *jnode
	var firstSchema *cschema
	for _, e := range n.elems {
		if e.kind == jNull {
			continue
		}
		if first == nil {
			first = e
		}
		if group(e.kind) != group(first.kind) {
			return nil, errNoSchema
		}
		if group(e.kind) == jInt32 {
			if firstSchema == nil {
				firstSchema, _ = inferSchema("", first)
			}
			if es, _ := inferSchema("", e); !es.equal(firstSchema) {
				return nil, errNoSchema
			}
		}
	}
	if first == nil {
		return nil, errNoSchema // only nulls
	}
	if first.kind != jObject {
		s, err := inferSchema("", first)
		if err == nil && s == nil {
			err = errNoSchema
		}
		return s, err
	}
	// Debezium merges the distinct element schemas in the order of a Java
	// HashSet; walrelay in the order they first occur. The fields and
	// values are the same; a consumer that reads JSON by name sees no
	// difference.
	var merged *cschema
	var seen []*cschema
	for _, e := range n.elems {
		if e.kind != jObject {
			continue
		}
		s, err := inferSchema(key, e)
		if err != nil {
			return nil, err
		}
		dup := false
		for _, x := range seen {
			dup = dup || x.equal(s)
		}
		if dup {
			continue
		}
		seen = append(seen, s)
		if merged == nil {
			merged = s
			continue
		}
		m := &cschema{typ: "struct", name: merged.name, fields: append([]cfield(nil), merged.fields...)}
		for _, f := range s.fields {
			if m.field(f.name) == nil {
				m.fields = append(m.fields, f)
			}
		}
		merged = m
	}
	return merged, nil
}

// group is a node type as Jackson's getNodeType sees it: every number one.
func group(k jkind) jkind {
	switch k {
	case jInt64, jBigInt, jFloat64:
		return jInt32
	}
	return k
}

// appendSchema appends s as the JsonConverter writes a schema, with the
// "field" name of a struct's field last.
func appendSchema(dst []byte, s *cschema, field string) []byte {
	dst = append(dst, `{"type":"`...)
	dst = append(dst, s.typ...)
	dst = append(dst, '"')
	switch s.typ {
	case "array":
		dst = append(dst, `,"items":`...)
		dst = appendSchema(dst, s.items, "")
	case "struct":
		dst = append(dst, `,"fields":[`...)
		for i, f := range s.fields {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendSchema(dst, f.schema, f.name)
		}
		dst = append(dst, ']')
	}
	dst = append(dst, `,"optional":true`...)
	if s.name != "" {
		dst = append(dst, `,"name":`...)
		dst = jacksonQuote(dst, []byte(s.name))
	}
	if field != "" {
		dst = append(dst, `,"field":`...)
		dst = jacksonQuote(dst, []byte(field))
	}
	return append(dst, '}')
}

// appendValue appends n as the JsonConverter writes it in schema s: a
// struct's fields in the schema's order, one the value lacks as null.
func appendValue(dst []byte, n *jnode, s *cschema) []byte {
	if n == nil || n.kind == jNull {
		return append(dst, "null"...)
	}
	switch n.kind {
	case jBool:
		return strconv.AppendBool(dst, n.b)
	case jString:
		return jacksonQuote(dst, []byte(n.text))
	case jInt32, jInt64:
		v, _ := strconv.ParseInt(n.text, 10, 64)
		return strconv.AppendInt(dst, v, 10)
	case jBigInt:
		// Debezium's converter fails on it (a BigDecimal in a float64
		// schema); walrelay keeps the literal.
		return append(dst, n.text...)
	case jFloat64:
		f, _ := strconv.ParseFloat(n.text, 64)
		return appendJavaDouble(dst, f)
	case jArray:
		var items *cschema
		if s != nil {
			items = s.items
		}
		dst = append(dst, '[')
		for i, e := range n.elems {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendValue(dst, e, items)
		}
		return append(dst, ']')
	}
	dst = append(dst, '{')
	if s == nil {
		s = &cschema{}
	}
	for i, f := range s.fields {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = jacksonQuote(dst, []byte(f.name))
		dst = append(dst, ':')
		dst = appendValue(dst, n.field(f.name), f.schema)
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
	if len(payload) == 0 || (payload[0] != '{' && payload[0] != '[') {
		return nil, false
	}
	n, err := parseJSON(payload)
	if err != nil {
		return nil, false
	}
	s, err := inferSchema(column, n)
	if err != nil || s == nil {
		return nil, false
	}
	out := make([]byte, 0, len(payload)+64)
	if f == FormatJSONSchema {
		out = append(out, `{"schema":`...)
		out = appendSchema(out, s, "")
		out = append(out, `,"payload":`...)
	}
	out = appendValue(out, n, s)
	if f == FormatJSONSchema {
		out = append(out, '}')
	}
	return out, true
}

// expand is the expanded value of e's payload, if the sink expands JSON
// payloads and Debezium would expand this one.
func (s *Sink) expand(e *event.Event) ([]byte, bool) {
	if !s.cfg.ExpandJSONPayload || e.Payload == nil {
		return nil, false
	}
	return s.cfg.ValueFormat.expandJSON(e.Payload, e.PayloadColumn)
}
