package schemafirst

import (
	"encoding/json"
	"math/big"
	"reflect"
	"regexp/syntax"
	"slices"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Bounding the JSON Schema validator's work on a payload before it
// runs: validationCost estimates it, in the steps of jsonschema_steps.go.

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
