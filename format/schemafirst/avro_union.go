package schemafirst

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/hamba/avro/v2"
)

// Writing a JSON value in an Avro union: choosing the branch as Avro's
// Java library and Avro's JSON encoding ({"type": value}) do.

// unionKey is a union and a value written in it: an object (v its map) or
// an array (v its items, n their count), as decodeJSON or a field's
// default holds it; avroJSON and depth as the write was called with (a
// default within more defaults is refused beyond maxDefaultDepth).
type unionKey struct {
	u        *avro.UnionSchema
	v        uintptr
	n        int
	avroJSON bool
	depth    int
}

// unionChoice is how a union writes a value: its branch (in Avro's JSON
// encoding of a union, {"<branch>": value}, if wrapped), or why none fits
// (reason; field: where, after the union's own JSON pointer, if known: a
// union resolved while another tried its branches has no field).
type unionChoice struct {
	branch        int
	wrapped       bool
	field, reason string
	known         bool
}

// union writes a union: its null for a null, else the first branch the
// value fits, or Avro's own JSON encoding of a union ({"<branch>":
// value}). An object's or an array's branch, once found (or that none
// fits), is kept in w.unions and taken at once when the union writes it
// again: each union tries its branches on each value once. The same
// value in the same union writes the same bytes wherever it is (what
// else it depends on, avroJSON and depth, is in the key), so what is
// written is what trying the branches again would write.
func (w *jsonAvroWriter) union(us *avro.UnionSchema, v any, avroJSON bool) (string, string) {
	types := us.Types()
	if v == nil {
		for i, b := range types {
			if b.Type() == avro.Null {
				w.long(int64(i))
				return "", ""
			}
		}
	}
	key, keyed := w.unionKey(us, v, avroJSON)
	if keyed {
		c, ok := w.unions[key]
		switch {
		case !ok:
		case c.reason == "" && w.dry:
			w.skipped = true
			return "", ""
		case c.reason == "":
			w.long(int64(c.branch))
			if c.wrapped {
				for k, e := range v.(map[string]any) {
					return w.in(pathToken{name: k}, types[c.branch], e, avroJSON)
				}
			}
			return w.write(types[c.branch], v, avroJSON)
		case w.trying > 0:
			return "", c.reason
		case c.known:
			return w.here() + c.field, c.reason
		}
		// Not resolved yet, or a failure whose field is wanted now.
	}
	choice, field, reason := w.resolve(us, v, avroJSON)
	if keyed && w.alts > 0 && !w.over {
		if reason != "" {
			choice.reason = reason
			if here := w.here(); w.trying == 0 && strings.HasPrefix(field, here) {
				// Kept after the union's own pointer: the same value
				// (a default's) may be written elsewhere.
				choice.field, choice.known = field[len(here):], true
			}
		}
		if w.unions == nil {
			w.unions = map[unionKey]unionChoice{}
		}
		w.unions[key] = choice
	}
	return field, reason
}

// unionKey is the key of v in us in w.unions, if v is an object or an
// array: a scalar costs about its bytes to try in each branch.
func (w *jsonAvroWriter) unionKey(us *avro.UnionSchema, v any, avroJSON bool) (unionKey, bool) {
	switch x := v.(type) {
	case map[string]any:
		return unionKey{u: us, v: reflect.ValueOf(x).Pointer(), avroJSON: avroJSON, depth: w.depth}, true
	case []any:
		return unionKey{u: us, v: reflect.ValueOf(x).Pointer(), n: len(x), avroJSON: avroJSON, depth: w.depth}, true
	}
	return unionKey{}, false
}

// resolve writes v, not null, in the first of a union's types that it
// fits, or in Avro's JSON encoding of a union: the branch written, or
// where and why none fits. The reasons of the branches that v does not
// fit are joined, clipped (clip) as a mismatch's reason is: each branch's
// holds those of the unions nested in it, which otherwise doubled with
// each level.
func (w *jsonAvroWriter) resolve(us *avro.UnionSchema, v any, avroJSON bool) (choice unionChoice, field, reason string) {
	types := us.Types()
	// The branch tried last before the wrapped form ({"<branch>":
	// value}), and the wrapped form's, if v is in it.
	last, wrapped := -1, -1
	for i, b := range types {
		if b.Type() != avro.Null {
			last = i
		}
	}
	var key string
	if m, ok := v.(map[string]any); ok && len(m) == 1 {
		for k := range m {
			key = k
		}
		for i, b := range types {
			if branchName(b) == key {
				wrapped = i
				break
			}
		}
	}
	mark := len(w.buf)
	var reasons []string
	for i, b := range types {
		if b.Type() == avro.Null {
			continue
		}
		alt := i < last || wrapped >= 0
		if alt {
			w.alts++
		}
		w.long(int64(i))
		w.trying++
		_, r := w.write(b, v, avroJSON)
		w.trying--
		if alt {
			w.alts--
		}
		if w.over || r == "" {
			return unionChoice{branch: i}, "", ""
		}
		w.buf = w.buf[:mark]
		reasons = append(reasons, r)
	}
	if wrapped >= 0 {
		w.long(int64(wrapped))
		field, reason := w.in(pathToken{name: key}, types[wrapped], v.(map[string]any)[key], avroJSON)
		return unionChoice{branch: wrapped, wrapped: true}, field, reason
	}
	return unionChoice{}, w.here(), clip(fmt.Sprintf("fits none of the union's types (%s): %s", avroTypeName(us), strings.Join(reasons, "; ")))
}
