package format

import (
	"bytes"
	"errors"
	"slices"
)

// Inferring a parsed JSON payload's (json.go) Kafka Connect schema as
// Debezium's EventRouter does with table.expand.json.payload=true
// (JsonSchemaData, with the default null and empty-array behaviours: such
// fields are left out). The JsonConverter's formats (package sink) and the
// registry formats (Avro here) write values in the schema inferred here.

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
