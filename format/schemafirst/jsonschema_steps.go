package schemafirst

import (
	"encoding/json"
	"math/big"
	"reflect"
	"strconv"
	"strings"
)

// The steps of the JSON Schema validator's work that validationCost
// (jsonschema_cost.go) counts: what reading a number, a pattern or a
// string costs it.

// Steps of the validator's work (work), a step some tens of nanoseconds
// (a member of an object walked).
const (
	// applicationSteps is an application of a subschema: some 500 ns to
	// 1 µs (allOf doubling 18 levels, 2^19 applications to a scalar:
	// 340 ms).
	applicationSteps = 16
	// hopsPerStep is how many applications around an application the
	// validator walks in a step, looking for a cycle or an anchor (a
	// pointer each).
	hopsPerStep = 16
	// stringBytesPerStep is how many bytes of a string the validator
	// copies in a step: it copies the string at every application
	// (strValidate's []byte(str), for contentEncoding, whether the
	// schema has one or not): some 350 µs for 1 MB.
	stringBytesPerStep = 32
	// patternUnitsPerStep is how many bytes times instructions of a
	// pattern's match are a step: [ab]{1000}c (some 2,000 instructions)
	// matched against 100 KB took 0.8 to 1.2 s, some 8 to 11 ns each.
	patternUnitsPerStep = 4
	// regexStepsPerByte, regexClassStepsPerByte,
	// regexBracketClassStepsPerByte and regexFoldStepsPerByte are parsing
	// a byte of a string under format "regex" (regexParseSteps): at most
	// some 150 ns; 2.1 µs with a Unicode class (\pL 10,000 times: 64 ms);
	// 18 µs with one in brackets; 80 µs with case folding and a class.
	regexStepsPerByte             = 32
	regexClassStepsPerByte        = 256
	regexBracketClassStepsPerByte = 2048
	regexFoldStepsPerByte         = 8192
)

// numberSteps is reading n, a number, with math/big, as the validator
// does for minimum, maximum, multipleOf, uniqueItems, const and enum
// (through fmt and big.Rat: some 400 ns to 1 µs, and 10^exponent: 1e1000
// some 5 µs).
func numberSteps(n json.Number) int {
	steps := 16 + len(n)/8
	if i := strings.IndexAny(string(n), "eE"); i >= 0 {
		e := strings.TrimLeft(string(n[i+1:]), "+-")
		if x, err := strconv.Atoi(e); err == nil && x > 0 {
			steps += x / 8
		}
	}
	return steps
}

// regexParseSteps is parsing s with Go's regexp/syntax (format "regex"),
// by the bytes of s: some 20 to 150 ns a byte (30 KB of (a|b) took
// 4.4 ms), but a Unicode class (\pL, \P{Greek}) copies its table, some
// 700 ranges (\pL 10,000 times: 64 ms), and a class in brackets sorts them
// ([\pL…], 30 KB: 530 ms, 18 µs a byte), and under case folding ((?i))
// a class's range is folded rune by rune ((?i)[\x{101}-\x{1E942}] 1,000
// times, 23 KB: 1.8 s, 79 µs a byte).
func regexParseSteps(s string) int {
	per := regexStepsPerByte
	unicodeClass := strings.Contains(s, `\p`) || strings.Contains(s, `\P`)
	brackets := strings.Contains(s, "[")
	switch {
	case (unicodeClass || brackets) && foldsCase(s):
		per = regexFoldStepsPerByte
	case unicodeClass && brackets:
		per = regexBracketClassStepsPerByte
	case unicodeClass:
		per = regexClassStepsPerByte
	}
	return 1 + len(s)*per
}

// foldsCase reports whether s, a regular expression, sets the flag i
// ((?i) or (?i:…)) anywhere.
func foldsCase(s string) bool {
	for i := strings.Index(s, "(?"); i >= 0; {
		for j := i + 2; j < len(s) && s[j] != ')' && s[j] != ':'; j++ {
			if s[j] == 'i' {
				return true
			}
		}
		k := strings.Index(s[i+2:], "(?")
		if k < 0 {
			break
		}
		i += 2 + k
	}
	return false
}

// ratSteps is comparing a number with r, a number of the schema
// (minimum, maximum, multipleOf), in math/big, beyond reading the number
// (numberSteps): a step for each 32 bits of r (multipleOf 0.333…, 999
// digits, against 500,000 numbers, 1 MB, took 1.9 s, some 3.7 µs each;
// minimum -1e1000 0.5 s).
func ratSteps(r *big.Rat) int {
	if r == nil {
		return 0
	}
	return (r.Num().BitLen() + r.Denom().BitLen()) / 32
}

// patternSteps is the steps of matching a string of n bytes with a pattern
// of insts instructions: Go's regexp (a linear automaton, unanchored)
// takes some nanoseconds for each byte and instruction.
func patternSteps(n, insts int) int {
	return n * max(insts, 1) / patternUnitsPerStep
}

// size is how many steps hashing or comparing v whole takes (uniqueItems,
// const, enum): a step for each value, member's name, and 64 bytes of a
// string; kept for each object and array.
func (c *costing) size(v any) int {
	var key costKey
	switch x := v.(type) {
	case string:
		return 1 + len(x)/64
	case json.Number:
		return numberSteps(x)
	case map[string]any:
		key = costKey{v: reflect.ValueOf(x).Pointer(), kind: 'o'}
	case []any:
		key = costKey{v: reflect.ValueOf(x).Pointer(), n: len(x), kind: 'a'}
	default:
		return 1
	}
	if n, ok := c.sizes[key]; ok {
		return n
	}
	n := 1
	switch x := v.(type) {
	case map[string]any:
		for name, e := range x {
			n = min(n+1+len(name)/64+c.size(e), c.limit+1)
		}
	case []any:
		for _, e := range x {
			n = min(n+c.size(e), c.limit+1)
		}
	}
	if c.sizes == nil {
		c.sizes = map[costKey]int{}
	}
	c.sizes[key] = n
	return n
}

// inner reports whether v holds an object or an array: the cost of one
// that does not (a scalar, or an object or array of scalars only) is not
// kept, as computing it again costs about its size, once for each
// subschema and object or array around it (kept): the costs kept are
// about as many as the objects and arrays that hold more, not all of
// them (keeping all, a payload of 65,526 empty objects in an array, 196
// KB, rose from a peak of some 16 MiB to 26).
func inner(v any) bool {
	switch x := v.(type) {
	case map[string]any:
		for _, e := range x {
			switch e.(type) {
			case map[string]any, []any:
				return true
			}
		}
	case []any:
		for _, e := range x {
			switch e.(type) {
			case map[string]any, []any:
				return true
			}
		}
	}
	return false
}
