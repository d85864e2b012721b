package format

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Parsing a JSON payload and inferring its Kafka Connect schema as
// Debezium's EventRouter does with table.expand.json.payload=true
// (JsonSchemaData, with the default null and empty-array behaviours: such
// fields are left out). The JsonConverter's formats (package sink) and the
// registry formats (Avro here) write values in the schema inferred here.

// Kind is the kind of a parsed JSON value, with Jackson's number kinds.
type Kind uint8

const (
	KindNull Kind = iota
	KindBool
	KindString
	KindInt32   // an integer literal that fits an int (IntNode)
	KindInt64   // one that fits a long (LongNode)
	KindBigInt  // a longer one (BigIntegerNode)
	KindFloat64 // a literal with a fraction or exponent (DoubleNode)
	KindArray
	KindObject
)

// Node is a parsed JSON value; an object keeps its keys in document order
// (a repeated key keeps its first place and its last value, as Jackson's
// ObjectNode).
type Node struct {
	Kind  Kind
	Text  string // a string's value, a number's literal
	Bool  bool
	Keys  []string
	Elems []*Node // an object's values (by keys) or an array's elements
	// index maps a wide object's keys to their place (ParseJSON makes it
	// past indexFrom keys), so that looking a key up is not linear.
	index map[string]int
}

// indexFrom is the number of keys from which ParseJSON indexes an object.
const indexFrom = 16

// Field returns the value of an object's key, nil if it has none.
func (n *Node) Field(k string) *Node {
	if n.index != nil {
		if i, ok := n.index[k]; ok {
			return n.Elems[i]
		}
		return nil
	}
	if i := indexOf(n.Keys, k); i >= 0 {
		return n.Elems[i]
	}
	return nil
}

// Jackson's StreamReadConstraints (its defaults, which Debezium's
// ObjectMapper keeps): a document that exceeds one fails readTree, and
// Debezium's EventRouter leaves such a payload a string.
const (
	// MaxNestingDepth is the deepest nesting of objects and arrays.
	MaxNestingDepth = 1000
	// MaxNumberLength is the most digits of a number (its integer,
	// fraction and exponent digits: neither sign nor point nor e).
	MaxNumberLength = 1000
	// MaxNameLength is the longest key, in UTF-16 code units.
	MaxNameLength = 50000
	// MaxStringLength is the longest string value, in UTF-16 code units.
	MaxStringLength = 20_000_000
)

// ErrJSONLimit is a JSON document beyond one of Jackson's read limits.
var ErrJSONLimit = errors.New("beyond Jackson's read limits")

// ParseJSON parses one JSON value from text; what follows it is ignored, as
// Jackson's readTree ignores it. A document beyond Jackson's limits
// (MaxNestingDepth, MaxNumberLength, MaxNameLength, MaxStringLength) is
// ErrJSONLimit. The time taken is linear in the text.
//
// The escape of a lone UTF-16 surrogate (\ud800 not followed by a low
// one's escape, a \udc00 not after a high one's), which Jackson reads into
// a Java string as that one char, is kept in the string or key as the
// surrogate's three bytes of WTF-8 (ED A0 80 for U+D800; not valid UTF-8,
// which Go's decoder would make U+FFFD): the JSON formats write it back as
// its escape, as Jackson does; the avro format rewrites such escapes
// before (javaSurrogates).
func ParseJSON(text []byte) (*Node, error) {
	d := json.NewDecoder(bytes.NewReader(text))
	d.UseNumber()
	p := &jsonParser{d: d}
	if len(javaSurrogates(text)) != len(text) { // it has a lone surrogate
		p.text = text
	}
	return p.value(0)
}

// jsonParser parses a JSON text with d; text is set where it holds a lone
// surrogate's escape, and strings with an escape are then read again from
// it (unquoteWTF8).
type jsonParser struct {
	d    *json.Decoder
	text []byte
}

// token is the decoder's next token; a string, with its lone surrogates
// kept (see ParseJSON), checked against limit UTF-16 code units.
func (p *jsonParser) token(limit int, what string) (json.Token, error) {
	from := p.d.InputOffset()
	tok, err := p.d.Token()
	if err != nil {
		return nil, err
	}
	v, ok := tok.(string)
	if !ok {
		return tok, nil
	}
	if err := checkLength(v, limit, what); err != nil {
		return nil, err
	}
	if p.text != nil {
		raw := p.text[from:p.d.InputOffset()]
		if q := bytes.IndexByte(raw, '"'); q >= 0 && len(raw) >= q+2 && bytes.IndexByte(raw, '\\') >= 0 {
			return unquoteWTF8(raw[q+1 : len(raw)-1]), nil
		}
	}
	return v, nil
}

// unquoteWTF8 is the value of a JSON string's quoted text (valid, between
// its quotes) as Go's decoder reads it, but a lone surrogate's escape
// kept as the surrogate's WTF-8 bytes.
func unquoteWTF8(q []byte) string {
	b := make([]byte, 0, len(q))
	for i := 0; i < len(q); {
		c := q[i]
		if c != '\\' {
			r, n := utf8.DecodeRune(q[i:])
			if r == utf8.RuneError && n == 1 {
				b = utf8.AppendRune(b, utf8.RuneError)
			} else {
				b = append(b, q[i:i+n]...)
			}
			i += n
			continue
		}
		if i+1 >= len(q) {
			break
		}
		switch e := q[i+1]; e {
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			u, _ := hex4(q, i+2)
			i += 6
			if u >= 0xd800 && u < 0xdc00 && i+6 <= len(q) && q[i] == '\\' && q[i+1] == 'u' {
				if l, ok := hex4(q, i+2); ok && l >= 0xdc00 && l < 0xe000 {
					b = utf8.AppendRune(b, utf16.DecodeRune(u, l))
					i += 6
					continue
				}
			}
			if u >= 0xd800 && u < 0xe000 {
				b = append(b, byte(0xe0|u>>12), byte(0x80|u>>6&0x3f), byte(0x80|u&0x3f))
			} else {
				b = utf8.AppendRune(b, u)
			}
			continue
		default: // " \ /
			b = append(b, e)
		}
		i += 2
	}
	return string(b)
}

// value parses the next value, within depth objects and arrays.
func (p *jsonParser) value(depth int) (*Node, error) {
	d := p.d
	tok, err := p.token(MaxStringLength, "string")
	if err != nil {
		return nil, err
	}
	switch v := tok.(type) {
	case nil:
		return &Node{Kind: KindNull}, nil
	case bool:
		return &Node{Kind: KindBool, Bool: v}, nil
	case string:
		return &Node{Kind: KindString, Text: v}, nil
	case json.Number:
		if digits := numberDigits(string(v)); digits > MaxNumberLength {
			return nil, fmt.Errorf("a number of %d digits, more than %d: %w", digits, MaxNumberLength, ErrJSONLimit)
		}
		return &Node{Kind: numberKind(string(v)), Text: string(v)}, nil
	case json.Delim:
		if depth++; depth > MaxNestingDepth {
			return nil, fmt.Errorf("nested %d deep, more than %d: %w", depth, MaxNestingDepth, ErrJSONLimit)
		}
		n := &Node{Kind: KindArray}
		if v == '{' {
			n.Kind = KindObject
		}
		for d.More() {
			key := ""
			if n.Kind == KindObject {
				t, err := p.token(MaxNameLength, "key")
				if err != nil {
					return nil, err
				}
				key, _ = t.(string)
			}
			x, err := p.value(depth)
			if err != nil {
				return nil, err
			}
			if n.Kind == KindObject {
				if i := n.keyIndex(key); i >= 0 {
					n.Elems[i] = x
					continue
				}
				n.Keys = append(n.Keys, key)
				if n.index != nil {
					n.index[key] = len(n.Keys) - 1
				} else if len(n.Keys) == indexFrom {
					n.index = make(map[string]int, 2*indexFrom)
					for i, k := range n.Keys {
						n.index[k] = i
					}
				}
			}
			n.Elems = append(n.Elems, x)
		}
		if _, err := d.Token(); err != nil { // the closing delimiter
			return nil, err
		}
		return n, nil
	}
	return nil, errors.New("unexpected JSON token")
}

// keyIndex is the place of an object's key, -1 if it has none.
func (n *Node) keyIndex(k string) int {
	if n.index != nil {
		if i, ok := n.index[k]; ok {
			return i
		}
		return -1
	}
	return indexOf(n.Keys, k)
}

func indexOf(keys []string, k string) int {
	for i, x := range keys {
		if x == k {
			return i
		}
	}
	return -1
}

// checkLength fails a string longer than limit UTF-16 code units (Java's
// String length).
func checkLength(s string, limit int, what string) error {
	if len(s) <= limit {
		return nil // at most len(s) code units
	}
	units := 0
	for _, r := range s {
		units++
		if r > 0xFFFF {
			units++
		}
	}
	if units > limit {
		return fmt.Errorf("a %s of %d characters, more than %d: %w", what, units, limit, ErrJSONLimit)
	}
	return nil
}

// numberDigits counts the digits of a number literal, as Jackson's
// ReaderBasedJsonParser measures its length: every digit, but an integer
// part of a single 0 is not counted when the number has a fraction or an
// exponent, not both (Jackson reads "0." and 1000 nines, "0e" and 1000
// ones, and refuses "0.9e" and 999 ones: Debezium's harness,
// testdata/debezium_avro_Probe.java.txt).
func numberDigits(lit string) int {
	n := 0
	for i := 0; i < len(lit); i++ {
		if lit[i] >= '0' && lit[i] <= '9' {
			n++
		}
	}
	digits := strings.TrimPrefix(lit, "-")
	if len(digits) > 1 && digits[0] == '0' {
		fraction := digits[1] == '.'
		exponent := strings.ContainsAny(digits, "eE")
		if fraction != exponent {
			n--
		}
	}
	return n
}

// numberKind is the node Jackson makes of a number literal.
func numberKind(lit string) Kind {
	if strings.ContainsAny(lit, ".eE") {
		return KindFloat64
	}
	v, err := strconv.ParseInt(lit, 10, 64)
	switch {
	case err != nil:
		return KindBigInt
	case v >= math.MinInt32 && v <= math.MaxInt32:
		return KindInt32
	}
	return KindInt64
}

// ConnectSchema is an inferred Kafka Connect schema (every one optional).
type ConnectSchema struct {
	Type   string // as the JsonConverter names it: int32, int64, double, boolean, string, array, struct
	Name   string // a struct's name; "" none
	Items  *ConnectSchema
	Fields []ConnectField
	// Required is a schema that is not optional (every inferred one is
	// optional); Version is a Connect schema's version, 0 none.
	Required bool
	Version  int
}

// ConnectField is a field of a struct's ConnectSchema.
type ConnectField struct {
	Name   string
	Schema *ConnectSchema
}

// Field returns the schema of a struct's field, nil if it has none.
func (s *ConnectSchema) Field(name string) *ConnectSchema {
	for _, f := range s.Fields {
		if f.Name == name {
			return f.Schema
		}
	}
	return nil
}

// Equal compares two schemas as Connect's ConnectSchema.equals does.
func (s *ConnectSchema) Equal(o *ConnectSchema) bool {
	if s == nil || o == nil {
		return s == o
	}
	if s.Type != o.Type || s.Name != o.Name || s.Required != o.Required || s.Version != o.Version || len(s.Fields) != len(o.Fields) || !s.Items.Equal(o.Items) {
		return false
	}
	for i, f := range s.Fields {
		if f.Name != o.Fields[i].Name || !f.Schema.Equal(o.Fields[i].Schema) {
			return false
		}
	}
	return true
}

var ErrNoSchema = errors.New("no schema can be inferred")

// InferSchema is JsonSchemaData.toConnectSchema: nil for a value it leaves
// out (a null, an empty array), an error where Debezium's expansion fails.
func InferSchema(key string, n *Node) (*ConnectSchema, error) {
	switch n.Kind {
	case KindString:
		return &ConnectSchema{Type: "string"}, nil
	case KindBool:
		return &ConnectSchema{Type: "boolean"}, nil
	case KindInt32:
		return &ConnectSchema{Type: "int32"}, nil
	case KindInt64:
		return &ConnectSchema{Type: "int64"}, nil
	case KindBigInt, KindFloat64:
		return &ConnectSchema{Type: "double"}, nil
	case KindArray:
		if len(n.Elems) == 0 {
			return nil, nil
		}
		items, err := itemSchema(key, n)
		if err != nil {
			return nil, err
		}
		return &ConnectSchema{Type: "array", Items: items}, nil
	case KindObject:
		s := &ConnectSchema{Type: "struct", Name: key}
		for i, k := range n.Keys {
			fk := k
			if key != "" {
				fk = key + "." + k
			}
			fs, err := InferSchema(fk, n.Elems[i])
			if err != nil {
				return nil, err
			}
			if fs != nil && k == "" {
				// Connect's SchemaBuilder.field throws ("fieldName
				// cannot be null"): Debezium leaves the payload a
				// string. A null or empty array under it is left out.
				return nil, ErrNoSchema
			}
			if fs != nil {
				s.Fields = append(s.Fields, ConnectField{k, fs})
			}
		}
		return s, nil
	}
	return nil, nil
}

// itemSchema is the schema of an array's elements: the first non-null
// element's, all of one node type (and number kind); for objects, their
// distinct schemas merged.
func itemSchema(key string, n *Node) (*ConnectSchema, error) {
	var first *Node
	var firstSchema *ConnectSchema
	for _, e := range n.Elems {
		if e.Kind == KindNull {
			continue
		}
		if first == nil {
			first = e
		}
		if group(e.Kind) != group(first.Kind) {
			return nil, ErrNoSchema
		}
		if group(e.Kind) == KindInt32 {
			if firstSchema == nil {
				firstSchema, _ = InferSchema("", first)
			}
			if es, _ := InferSchema("", e); !es.Equal(firstSchema) {
				return nil, ErrNoSchema
			}
		}
	}
	if first == nil {
		return nil, ErrNoSchema // only nulls
	}
	if first.Kind != KindObject {
		s, err := InferSchema("", first)
		if err == nil && s == nil {
			err = ErrNoSchema
		}
		return s, err
	}
	// Debezium merges the distinct element schemas (a Java HashSet of
	// them) in the set's order: the first one's fields, then each next
	// one's fields that are not there yet (a field of one name keeps the
	// schema met first: one element's nested record); a merge of two or
	// more is a required struct (SchemaUtil.copySchemaBasics drops
	// optional), one schema alone stays optional. The set's order hangs
	// on Java identity hash codes, so it changes from one JVM to the
	// next; walrelay sorts the distinct schemas by a key of their own,
	// so that one set always gives one merge (and a merge is equal to
	// another as Debezium's are).
	//
	// The distinct schemas are found by their key (appendKey, then Equal
	// among those of one key) and the fields merged by name, in maps: the
	// time is about linear in the elements' schemas (n log n for the sort),
	// not in their count times the distinct ones' (20 000 objects of a key
	// each took seconds).
	var seen []*ConnectSchema
	var keys [][]byte
	byKey := map[string][]int{} // a key's distinct schemas, by place in seen
	for _, e := range n.Elems {
		if e.Kind != KindObject {
			continue
		}
		s, err := InferSchema(key, e)
		if err != nil {
			return nil, err
		}
		k := s.appendKey(nil)
		dup := false
		for _, i := range byKey[string(k)] {
			dup = dup || seen[i].Equal(s)
		}
		if !dup {
			byKey[string(k)] = append(byKey[string(k)], len(seen))
			seen, keys = append(seen, s), append(keys, k)
		}
	}
	if len(seen) == 1 {
		return seen[0], nil
	}
	order := make([]int, len(seen))
	for i := range seen {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return bytes.Compare(keys[a], keys[b]) })
	base := seen[order[0]]
	merged := &ConnectSchema{Type: "struct", Name: base.Name, Version: base.Version, Required: true, Fields: slices.Clone(base.Fields)}
	names := make(map[string]struct{}, len(base.Fields))
	for _, f := range base.Fields {
		names[f.Name] = struct{}{}
	}
	for _, i := range order[1:] {
		for _, f := range seen[i].Fields {
			if _, ok := names[f.Name]; !ok {
				names[f.Name] = struct{}{}
				merged.Fields = append(merged.Fields, f)
			}
		}
	}
	return merged, nil
}

// appendKey appends a text that orders schemas (the order in which
// itemSchema merges them): its type, name, optionality and fields.
func (s *ConnectSchema) appendKey(dst []byte) []byte {
	dst = append(dst, s.Type...)
	dst = append(dst, 0)
	dst = append(dst, s.Name...)
	if s.Required {
		dst = append(dst, 0, 'r')
	}
	if s.Items != nil {
		dst = append(dst, '[')
		dst = s.Items.appendKey(dst)
		dst = append(dst, ']')
	}
	if s.Type == "struct" {
		dst = append(dst, '{')
		for _, f := range s.Fields {
			dst = append(dst, f.Name...)
			dst = append(dst, 0)
			dst = f.Schema.appendKey(dst)
			dst = append(dst, 1)
		}
		dst = append(dst, '}')
	}
	return dst
}

// group is a node type as Jackson's getNodeType sees it: every number one.
func group(k Kind) Kind {
	switch k {
	case KindInt64, KindBigInt, KindFloat64:
		return KindInt32
	}
	return k
}
