package format

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Parsing a JSON payload as Jackson parses it, within Jackson's read
// limits: the tree that InferSchema (connect.go) infers a Kafka Connect
// schema of, and that every registry format writes.

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
