package schemafirst

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"reflect"
	"regexp"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/walrelay/walrelay/format"
)

// jsonSchemaURL is the URL the subject's schema is compiled under.
const jsonSchemaURL = "walrelay:///subject.json"

// compileJSONSchema compiles a JSON Schema of the registry (refs: the
// schemas it references, by the name it references them with) and
// returns the writer of JSON payloads valid in it: the JSON as it is,
// after Confluent's framing. The schema's draft is its $schema (default
// 2020-12); nothing is fetched from elsewhere.
func compileJSONSchema(text string, refs map[string]string, mismatch func(field, reason string) *MismatchError) (func(dst, payload []byte) ([]byte, *MismatchError), error) {
	sch, err := CompileJSONSchema(text, refs)
	if err != nil {
		return nil, err
	}
	return func(dst, payload []byte) ([]byte, *MismatchError) {
		if field, reason, ok := sch.Check(payload); !ok {
			return nil, mismatch(field, reason)
		}
		return append(dst, payload...), nil
	}, nil
}

// JSONSchema is a compiled JSON Schema of the registry, with the
// subschemas its dynamic and recursive references may resolve to
// (validationCost).
type JSONSchema struct {
	s       *jsonschema.Schema
	targets refTargets
}

// CompileJSONSchema compiles a JSON Schema of the registry (refs: the
// schemas it references, by the name it references them with, as
// Registry.References gives them). The schema's draft is its $schema
// (default 2020-12); nothing is fetched from elsewhere.
func CompileJSONSchema(text string, refs map[string]string) (*JSONSchema, error) {
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	// Once the schema is compiled, the validator calls its regexp engine
	// only to check format "regex" (asserted by default for draft-07 and
	// older), a string of the payload at every application, which only
	// has to parse: Go's regexp.Compile also builds its program, as long
	// as the string times its repetitions (\pL{1000} 3,000 times, 27 KB,
	// took 0.82 s an application, 26 ms to parse).
	var compiled atomic.Bool
	c.UseRegexpEngine(func(re string) (jsonschema.Regexp, error) {
		if !compiled.Load() {
			return regexp.Compile(re)
		}
		if _, err := syntax.Parse(re, syntax.Perl); err != nil {
			return nil, err
		}
		return &parsedRegexp{s: re}, nil
	})
	// The schema's numbers are held to a payload's bounds: the validator
	// compares a value with them (minimum, maximum, multipleOf, const,
	// enum) in math/big at every application, and validationCost charges
	// the payload's number, not the schema's (multipleOf 1e-200000 against
	// 50,000 numbers, 100 KB, took 6.1 s).
	if reason := jsonNumbersWithin([]byte(text)); reason != "" {
		return nil, fmt.Errorf("the JSON Schema: %s", reason)
	}
	for name, t := range refs {
		if reason := jsonNumbersWithin([]byte(t)); reason != "" {
			return nil, fmt.Errorf("the referenced JSON Schema %s: %s", name, reason)
		}
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("parse the JSON Schema: %w", err)
	}
	if err := c.AddResource(jsonSchemaURL, doc); err != nil {
		return nil, fmt.Errorf("the JSON Schema: %w", err)
	}
	for name, t := range refs {
		d, err := jsonschema.UnmarshalJSON(strings.NewReader(t))
		if err != nil {
			return nil, fmt.Errorf("parse the referenced JSON Schema %s: %w", name, err)
		}
		if err := c.AddResource("walrelay:///"+strings.TrimPrefix(name, "/"), d); err != nil {
			return nil, fmt.Errorf("the referenced JSON Schema %s: %w", name, err)
		}
	}
	sch, err := c.Compile(jsonSchemaURL)
	if err != nil {
		return nil, fmt.Errorf("compile the JSON Schema: %w", err)
	}
	compiled.Store(true)
	js := &JSONSchema{s: sch}
	js.targets.collect(sch, map[*jsonschema.Schema]bool{})
	return js, nil
}

// parsedRegexp is a regular expression that parsed, compiled only if
// matched (format "regex" only checks that it parses).
type parsedRegexp struct {
	s    string
	once sync.Once
	re   *regexp.Regexp
}

func (r *parsedRegexp) String() string { return r.s }

// MatchString compiles the expression, once, and matches s (never, if
// it does not compile: the validator does not match a format's regex).
func (r *parsedRegexp) MatchString(s string) bool {
	r.once.Do(func() { r.re, _ = regexp.Compile(r.s) })
	return r.re != nil && r.re.MatchString(s)
}

// Check validates payload, a JSON document: ok, or where it fails (a JSON
// pointer, "" for the whole document) and why, each at most 1 KB
// (maxCheckReason, cut with an ellipsis).
//
// A number with more than MaxJSONNumberDigits digits or an exponent
// beyond ±MaxJSONNumberExponent is refused before the validation, which
// reads numbers with math/big (1e999999 took some 20 ms each).
func (s *JSONSchema) Check(payload []byte) (field, reason string, ok bool) {
	if reason := jsonNumbersWithin(payload); reason != "" {
		return "", reason, false
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return "", clipCheckReason(fmt.Sprintf("not JSON: %v", err)), false
	}
	limit := jsonSchemaSteps(len(payload))
	n, deep := validationCost(s.s, &s.targets, v, limit)
	if deep {
		return "", fmt.Sprintf("validating it could nest more than %d applications of subschemas (MaxJSONSchemaDepth): its values or the references between its subschemas nested too deep", MaxJSONSchemaDepth), false
	}
	if n > limit {
		return "", fmt.Sprintf("validating it could take more than %d steps (%d, and %d a byte of the payload): subschemas applied to its values (anyOf, oneOf or allOf nested too deep), members walked, patterns matched or items compared", limit, jsonSchemaStepsBase, jsonSchemaStepsPerByte), false
	}
	if err := s.s.Validate(v); err != nil {
		ve, isVE := err.(*jsonschema.ValidationError)
		if !isVE {
			return "", clipCheckReason(err.Error()), false
		}
		field, reason = firstCause(ve)
		return clipCheckReason(field), clipCheckReason(reason), false
	}
	return "", "", true
}

// maxCheckReason bounds JSONSchema.Check's field and reason: the
// validator's reason quotes the value (a format's failure three times: a
// 358 KB string that is not a date made a reason of 1,075,280 bytes),
// and the inbox's undecodable error carries it into its log and its dead
// letter's header.
const maxCheckReason = 1024

// clipCheckReason cuts s to maxCheckReason bytes, on a character
// boundary, and marks the cut with an ellipsis.
func clipCheckReason(s string) string {
	if len(s) <= maxCheckReason {
		return s
	}
	cut := maxCheckReason
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// Bounds of the validation of a payload against a JSON Schema, in steps
// of the validator's work (validationCost: an application of a subschema
// 16, a member walked one, a pattern's match by its length and program):
// at most jsonSchemaStepsBase and jsonSchemaStepsPerByte for each byte of
// the payload. The validator (santhosh-tekuri/jsonschema) applies each of
// an anyOf's, a oneOf's or an allOf's subschemas to the value in turn,
// again for each level: a oneOf of two objects, each with the oneOf again
// as a property, applied 2^depth times (324 bytes of 20 levels took 8 s,
// 30 levels hours: an outbox row that held the relay, an inbox message
// that held its consumer). Check bounds the work first and refuses a
// payload beyond it as a mismatch.
//
// A step took some 11 to 15 ns on a loaded 2-core machine, 35 at the
// worst measured (TestJSONSchemaCheckWorkCounted): the bound is some
// 0.05 to 0.15 s for a small payload, and for one of 1 MB (Kafka's
// default) 68 Mi steps, some 1 s, 2.4 s at the worst, with as long again
// at most for the estimate itself. A batch of 4,000 events of 612 KB, each
// a oneOf of 24 event types with some 20 subschemas each, is some 41 Mi
// steps (0.45 s validating): within; of 64 types, 110 Mi (1.4 to 2 s):
// refused. A larger bound would let a payload hold walrelay's row (or an
// inbox partition) longer.
const (
	jsonSchemaStepsBase    = 1 << 22
	jsonSchemaStepsPerByte = 64
)

// jsonSchemaSteps is the bound of a payload of n bytes.
func jsonSchemaSteps(n int) int { return jsonSchemaStepsBase + jsonSchemaStepsPerByte*n }

// MaxJSONSchemaDepth bounds how deep the validation of a payload against a
// JSON Schema may nest: applications of subschemas within one another on
// one path (a $ref, each of an allOf's, an item's or a property's
// subschema: each a level). Both the validator (santhosh-tekuri/jsonschema)
// and validationCost recurse once a level, and nothing else bounded the
// depth but the steps: 9,000 nested arrays against a schema of 100 chained
// $refs a level (5 KB) were 900,000 levels, past Go's stack of 1 GB,
// "fatal error: stack overflow" (no recover catches it: walrelay killed
// at the row, at each restart; the inbox's consumer too). The validator
// takes some 2.5 KB of stack a level (4 KB at most, measured), so 10,000
// levels are some 25 to 40 MB of stack, well within Go's 1 GB; a real
// document nests some tens of levels, with a few references each.
const MaxJSONSchemaDepth = 10_000

// validationCost bounds the validator's work in applying sch to v, in
// steps (work, for each application of a subschema), counted up to
// limit+1: each subschema that may apply to a value counted as applied
// (all of an anyOf's, each pattern property's, whether its pattern
// matches or not), a dynamic reference as its costliest target. It is
// computed once for each subschema and object or array that holds one
// (scalars by type, their costs not kept), and its own work is counted
// in the same steps and stops beyond limit: it grows with the payload
// times the schema, whatever the validator's would. Content
// (contentSchema) is not asserted: walrelay's compiler does not
// (Compiler.AssertContent), and no extension is registered.
//
// deep is whether the validation would nest beyond MaxJSONSchemaDepth
// (then n is beyond limit too): the estimate stops there, with a stack of
// some 10,000 of its own frames.
func validationCost(sch *jsonschema.Schema, targets *refTargets, v any, limit int) (n int, deep bool) {
	c := costing{refTargets: targets, limit: limit, memo: map[costKey]known{}}
	n, _ = c.cost(sch, v)
	if c.deep {
		return c.limit + 1, true
	}
	return n, false
}

// costing is validationCost's state: the costs known (kept), the
// subschemas being costed (path, the last same of them applied to the
// same value: one met again among those is a reference cycle, which the
// validator stops with an error; cut, a cost computed around one, not
// kept), and the steps taken (costs computed, not kept ones read); how
// deep the applications being costed nest (depth, path's length), and
// whether they nested beyond MaxJSONSchemaDepth (deep: the estimate
// stops).
type costing struct {
	*refTargets
	limit, steps int
	depth, same  int
	deep         bool
	sizes        map[costKey]int
	memo         map[costKey]known
	path         []*jsonschema.Schema
	cut          bool
}

// known is a kept cost: its steps, and how deep its applications nest
// (the validator's recursion where the estimate reads a kept cost).
type known struct{ n, depth int }

// over reports whether the estimate has stopped: beyond its steps or its
// depth.
func (c *costing) over() bool { return c.steps > c.limit || c.deep }

// refTargets are the subschemas that a $dynamicRef or a $recursiveRef
// may resolve to: those with a $dynamicAnchor, by its name, and those
// with $recursiveAnchor.
type refTargets struct {
	dynamic   map[string][]*jsonschema.Schema
	recursive []*jsonschema.Schema
	// patterns are the instructions of each pattern's program, by its
	// text (patternSteps).
	patterns map[string]int
}

// costKey is a subschema and a value: an object's map or an array's items
// (v, n their count), or a scalar by its type (v 0, kind).
type costKey struct {
	s    *jsonschema.Schema
	v    uintptr
	n    int
	kind byte
}

// collect finds the subschemas of s that a $dynamicRef or a $recursiveRef
// may resolve to.
func (c *refTargets) collect(s *jsonschema.Schema, seen map[*jsonschema.Schema]bool) {
	if s == nil || seen[s] {
		return
	}
	seen[s] = true
	if s.DynamicAnchor != "" {
		if c.dynamic == nil {
			c.dynamic = map[string][]*jsonschema.Schema{}
		}
		c.dynamic[s.DynamicAnchor] = append(c.dynamic[s.DynamicAnchor], s)
	}
	if s.RecursiveAnchor {
		c.recursive = append(c.recursive, s)
	}
	if s.Pattern != nil {
		c.pattern(s.Pattern.String())
	}
	for re := range s.PatternProperties {
		c.pattern(re.String())
	}
	for _, sub := range subschemas(s) {
		c.collect(sub, seen)
	}
}

// pattern keeps how many instructions the program of the pattern re has
// (Go's regexp's, as the validator compiles it; as many as its bytes if
// it does not compile so).
func (c *refTargets) pattern(re string) {
	if _, ok := c.patterns[re]; ok {
		return
	}
	if c.patterns == nil {
		c.patterns = map[string]int{}
	}
	insts := len(re)
	if r, err := syntax.Parse(re, syntax.Perl); err == nil {
		if p, err := syntax.Compile(r.Simplify()); err == nil {
			insts = len(p.Inst)
		}
	}
	c.patterns[re] = insts
}

// subschemas are every subschema s holds, for collect.
func subschemas(s *jsonschema.Schema) []*jsonschema.Schema {
	subs := []*jsonschema.Schema{s.Ref, s.RecursiveRef, s.Not, s.If, s.Then, s.Else, s.PropertyNames, s.UnevaluatedProperties,
		s.Contains, s.Items2020, s.UnevaluatedItems, s.ContentSchema}
	if s.DynamicRef != nil {
		subs = append(subs, s.DynamicRef.Ref)
	}
	subs = append(subs, s.AllOf...)
	subs = append(subs, s.AnyOf...)
	subs = append(subs, s.OneOf...)
	subs = append(subs, s.PrefixItems...)
	for _, p := range s.Properties {
		subs = append(subs, p)
	}
	for _, p := range s.PatternProperties {
		subs = append(subs, p)
	}
	for _, d := range s.Dependencies {
		if d, ok := d.(*jsonschema.Schema); ok {
			subs = append(subs, d)
		}
	}
	for _, d := range s.DependentSchemas {
		subs = append(subs, d)
	}
	for _, x := range []any{s.AdditionalProperties, s.AdditionalItems, s.Items} {
		switch x := x.(type) {
		case *jsonschema.Schema:
			subs = append(subs, x)
		case []*jsonschema.Schema:
			subs = append(subs, x...)
		}
	}
	return subs
}

// cost is validationCost of s for v, and how deep its applications nest
// (1 for s alone). Each application is charged the validator's work in it
// (work) besides its subschemas'.
func (c *costing) cost(s *jsonschema.Schema, v any) (n, depth int) {
	if s == nil {
		return 0, 0
	}
	if c.over() {
		return c.limit + 1, 0
	}
	if s.Bool != nil {
		return 1, 1
	}
	var key costKey
	switch x := v.(type) {
	case map[string]any:
		key = costKey{s: s, v: reflect.ValueOf(x).Pointer(), kind: 'o'}
	case []any:
		key = costKey{s: s, v: reflect.ValueOf(x).Pointer(), n: len(x), kind: 'a'}
	}
	if key.kind != 0 {
		if k, ok := c.memo[key]; ok {
			if c.depth+k.depth > MaxJSONSchemaDepth {
				c.deep = true
				return c.limit + 1, k.depth
			}
			return k.n, k.depth
		}
	}
	if slices.Contains(c.path[len(c.path)-c.same:], s) {
		// Applied again to the same value within itself: the validator
		// stops there (a reference cycle; it looks for one as this
		// does, through the applications to the same value around it,
		// charged in work). What is costed around it is not kept (it
		// would be less elsewhere), and what is not kept is bounded by
		// the steps.
		c.cut = true
		return 1, 1
	}
	if c.depth >= MaxJSONSchemaDepth {
		c.deep = true
		return c.limit + 1, 1
	}
	n = c.work(s, v)
	if c.steps += n; c.steps > c.limit {
		return c.limit + 1, 1
	}
	c.path = append(c.path, s)
	c.depth++
	c.same++
	cut := c.cut
	c.cut = false
	add := func(k, d int) {
		n = min(n+k, c.limit+1)
		depth = max(depth, d)
	}
	for _, sub := range []*jsonschema.Schema{s.Ref, s.Not, s.If, s.Then, s.Else} {
		add(c.cost(sub, v))
	}
	for _, subs := range [][]*jsonschema.Schema{s.AllOf, s.AnyOf, s.OneOf} {
		for _, sub := range subs {
			add(c.cost(sub, v))
		}
	}
	if r := s.RecursiveRef; r != nil {
		targets := []*jsonschema.Schema{r}
		if r.RecursiveAnchor {
			targets = append(targets, c.recursive...)
		}
		add(c.costliest(targets, v))
	}
	if d := s.DynamicRef; d != nil {
		targets := []*jsonschema.Schema{d.Ref}
		if d.Anchor != "" && d.Ref != nil && d.Ref.DynamicAnchor == d.Anchor {
			targets = append(targets, c.dynamic[d.Anchor]...)
		}
		add(c.costliest(targets, v))
	}
	switch x := v.(type) {
	case map[string]any:
		for name, d := range s.Dependencies {
			if d, ok := d.(*jsonschema.Schema); ok && hasKey(x, name) {
				add(c.cost(d, v))
			}
		}
		for name, d := range s.DependentSchemas {
			if hasKey(x, name) {
				add(c.cost(d, v))
			}
		}
		for name, e := range x {
			add(c.inner(s.Properties[name], e))
			for _, p := range s.PatternProperties {
				add(c.inner(p, e))
			}
			if ap, ok := s.AdditionalProperties.(*jsonschema.Schema); ok {
				add(c.inner(ap, e))
			}
			add(c.inner(s.UnevaluatedProperties, e))
			if s.PropertyNames != nil {
				add(c.inner(s.PropertyNames, name))
			}
		}
	case []any:
		for i, e := range x {
			switch items := s.Items.(type) {
			case *jsonschema.Schema:
				add(c.inner(items, e))
			case []*jsonschema.Schema:
				if i < len(items) {
					add(c.inner(items[i], e))
				}
			}
			if ai, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
				add(c.inner(ai, e))
			}
			if i < len(s.PrefixItems) {
				add(c.inner(s.PrefixItems[i], e))
			}
			add(c.inner(s.Items2020, e))
			add(c.inner(s.Contains, e))
			add(c.inner(s.UnevaluatedItems, e))
		}
	}
	c.path = c.path[:len(c.path)-1]
	c.depth--
	c.same--
	depth++
	if key.kind != 0 && !c.cut && !c.over() && inner(v) {
		c.memo[key] = known{n, depth}
	}
	c.cut = c.cut || cut
	return n, depth
}

// inner is cost of s for e, a member or an item of the value being
// costed: the applications to e nest from none (same).
func (c *costing) inner(s *jsonschema.Schema, e any) (n, depth int) {
	same := c.same
	c.same = 0
	n, depth = c.cost(s, e)
	c.same = same
	return n, depth
}

// work is what the validator does in applying s to v besides applying
// its subschemas, in steps: one, and
//   - each member of an object or item of an array: it walks all of an
//     object's members at every application (objValidate's loop, whatever
//     s holds; unevalFrom's copy of their names), an array's items at most
//     once for each of items, prefixItems, contains and unevaluatedItems
//     (a member a step: an object of 5,000 members under some 2^19
//     applications, 40 KB, took over 30 s, each application counted one);
//   - a string: copied whole at every application;
//   - a pattern (pattern, or patternProperties for each name) matched
//     against a string: Go's regexp takes its length times the pattern's
//     program (patternSteps: five patterns of 1,000 instructions against
//     300 KB took 10 s, as five steps);
//   - uniqueItems: the array's items hashed whole (each pair compared,
//     for 20 items or fewer), a step for each value or 64 bytes of a
//     string within it (its size: nested arrays, each uniqueItems, 159 KB,
//     did not finish in 30 s);
//   - const and enum: the value compared whole, with each of the enum's
//     values (an enum of 5,000 strings against 50,000 strings, 700 KB,
//     took 1.9 s, as 50,000 steps);
//   - required, dependentRequired (and draft-04's dependencies): a step
//     for each name, looked up at every application to an object
//     (required of 5,000 names against 20,000 empty objects, 60 KB, took
//     4.9 to 18 s, as 20,000 steps);
//   - format "regex": the string parsed as a regular expression
//     (regexParseSteps);
//   - a $dynamicRef or a $recursiveRef: the validator looks for its
//     anchor through every application around it (depth), and every
//     application looks for a cycle through those to the same value
//     around it (same).
func (c *costing) work(s *jsonschema.Schema, v any) int {
	hops := c.same
	if s.DynamicRef != nil || s.RecursiveRef != nil {
		hops += c.depth
	}
	w := applicationSteps + hops/hopsPerStep
	switch x := v.(type) {
	case map[string]any:
		w += len(x) + len(s.Required)
		for _, names := range s.DependentRequired {
			w += 1 + len(names)
		}
		for _, d := range s.Dependencies {
			w++
			if names, ok := d.([]string); ok {
				w += len(names)
			}
		}
		for re := range s.PatternProperties {
			insts := c.patterns[re.String()]
			for name := range x {
				w += patternSteps(len(name), insts)
				if w > c.limit {
					return w
				}
			}
		}
	case []any:
		w += len(x)
		if s.UniqueItems && len(x) > 1 {
			size := c.size(x)
			if len(x) <= 20 {
				size *= len(x)
			}
			w += size
		}
	case string:
		w += len(x) / stringBytesPerStep
		if s.Pattern != nil {
			w += patternSteps(len(x), c.patterns[s.Pattern.String()])
		}
		if s.Format != nil && s.Format.Name == "regex" {
			w += regexParseSteps(x)
		}
	case json.Number:
		if s.Minimum != nil || s.Maximum != nil || s.ExclusiveMinimum != nil || s.ExclusiveMaximum != nil || s.MultipleOf != nil {
			w += numberSteps(x)
			for _, r := range []*big.Rat{s.Minimum, s.Maximum, s.ExclusiveMinimum, s.ExclusiveMaximum, s.MultipleOf} {
				w += ratSteps(r)
			}
		}
	}
	if s.Const != nil {
		w += c.size(v)
	}
	if s.Enum != nil {
		w += c.size(v) * len(s.Enum.Values)
	}
	return min(w, c.limit+1)
}

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

// costliest is the largest cost of the targets for v, and the deepest.
func (c *costing) costliest(targets []*jsonschema.Schema, v any) (most, depth int) {
	for _, t := range targets {
		n, d := c.cost(t, v)
		most, depth = max(most, n), max(depth, d)
	}
	return most, depth
}

func hasKey(m map[string]any, k string) bool {
	_, ok := m[k]
	return ok
}

var english = message.NewPrinter(language.English)

// firstCause is the first innermost error of a validation: where (a JSON
// pointer) and what.
func firstCause(ve *jsonschema.ValidationError) (field, reason string) {
	for len(ve.Causes) > 0 {
		ve = ve.Causes[0]
	}
	var sb strings.Builder
	for _, t := range ve.InstanceLocation {
		sb.WriteString("/" + pointerToken(t))
	}
	return sb.String(), ve.ErrorKind.LocalizedString(english)
}

// noLoader refuses every URL the schema does not hold: walrelay fetches
// no schema from the network or the disk.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s: not in the registry's schema or its references (walrelay loads nothing else)", url)
}

// Bounds of a number in a JSON document that a JSON Schema validates
// (JSONSchema.Check: registered_jsonschema's payloads, the inbox's
// ValidateJSON): the validator reads numbers with math/big's Rat, whose
// cost grows with the digits and with 10^exponent (1e999999, 8 bytes,
// costs some 20 ms; a payload of them hours), so a number beyond them is
// refused (a schema mismatch, the inbox's undecodable) by a linear scan
// before it. No real value comes near: a double's exponent is within
// ±324, PostgreSQL's numeric writes no exponent, and Jackson (a Java
// consumer's JSON reader) refuses a number of more than 1000 characters
// by default (StreamReadConstraints).
const (
	// MaxJSONNumberDigits is how many digits (before and after the
	// point) one number may have: Jackson's MaxNumberLength.
	MaxJSONNumberDigits = format.MaxNumberLength
	// MaxJSONNumberExponent is how large an exponent (after e or E, either
	// sign) one number may have.
	MaxJSONNumberExponent = 1000
)

// jsonNumbersWithin scans b, a JSON document, for a number beyond
// MaxJSONNumberDigits or MaxJSONNumberExponent, in one pass without
// allocating: "" if none, or why not. What is not JSON is left to the
// parser after it.
func jsonNumbersWithin(b []byte) string {
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c == '"' {
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			continue
		}
		if c != '-' && (c < '0' || c > '9') {
			continue
		}
		start, digits, exp, inExp := i, 0, 0, false
	number:
		for ; i < len(b); i++ {
			c := b[i]
			switch {
			case c >= '0' && c <= '9':
				if !inExp {
					digits++
				} else if exp <= MaxJSONNumberExponent {
					exp = exp*10 + int(c-'0')
				}
			case c == 'e' || c == 'E':
				inExp = true
			case c == '.' || c == '-' || c == '+':
			default:
				break number
			}
		}
		end := i
		i-- // the byte after the number is looked at again
		if digits > MaxJSONNumberDigits || exp > MaxJSONNumberExponent {
			return fmt.Sprintf("a number at byte %d (%s) beyond the bounds of %d digits and an exponent of ±%d", start, clipValue(string(b[start:end])), MaxJSONNumberDigits, MaxJSONNumberExponent)
		}
	}
	return ""
}
