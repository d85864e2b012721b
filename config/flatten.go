package config

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// flattener turns nested YAML mappings into dotted keys, from the YAML
// nodes themselves: a scalar is its text as written; a list of scalars
// the texts comma-separated; a list holding mappings its YAML text (the
// key is then marked in structured), which the key's setter decodes into
// string fields, as written too. line holds where each key was given.
type flattener struct {
	flat       map[string]string
	structured map[string]bool
	line       map[string]int
}

// resolve follows an alias to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func (f *flattener) mapping(prefix string, m *yaml.Node) error {
	here := map[string]int{} // this mapping's own keys: YAML forbids one twice
	for i := 0; i+1 < len(m.Content); i += 2 {
		kn, vn := resolve(m.Content[i]), resolve(m.Content[i+1])
		if kn.Kind != yaml.ScalarNode {
			return fmt.Errorf("line %d: a key must be a plain name", kn.Line)
		}
		name := kn.Value
		if prefix != "" {
			name = prefix + "." + kn.Value
		}
		if first, ok := here[kn.Value]; ok {
			return fmt.Errorf("key %s is given twice: line %d and line %d", name, first, kn.Line)
		}
		here[kn.Value] = kn.Line
		if err := f.value(name, kn.Line, vn); err != nil {
			return err
		}
	}
	return nil
}

func (f *flattener) value(name string, line int, v *yaml.Node) error {
	if v.Kind == yaml.MappingNode {
		return f.mapping(name, v)
	}
	if first, ok := f.line[name]; ok {
		return fmt.Errorf("key %s is given twice: line %d and line %d", name, first, line)
	}
	f.line[name] = line
	switch v.Kind {
	case yaml.SequenceNode:
		if slices.ContainsFunc(v.Content, func(x *yaml.Node) bool { return resolve(x).Kind == yaml.MappingNode }) {
			b, err := yaml.Marshal(v)
			if err != nil {
				return fmt.Errorf("key %s: %w", name, err)
			}
			f.flat[name], f.structured[name] = string(b), true
			return nil
		}
		parts := make([]string, 0, len(v.Content))
		for _, x := range v.Content {
			x = resolve(x)
			if x.Kind != yaml.ScalarNode {
				return fmt.Errorf("key %s: a list of plain values is expected", name)
			}
			t, err := scalarText(name, x)
			if err != nil {
				return err
			}
			parts = append(parts, t)
		}
		f.flat[name] = strings.Join(parts, ",")
	case yaml.ScalarNode:
		t, err := scalarText(name, v)
		if err != nil {
			return err
		}
		f.flat[name] = t
	default:
		return fmt.Errorf("key %s: line %d: a value, a list or a mapping is expected", name, v.Line)
	}
	return nil
}

// scalarText is a scalar's text as written, the value of key name; nothing
// written is empty. YAML reads an unquoted ~, null, Null or NULL as its
// null, which would be empty too, silently, where the text meant may be a
// password or a prefix: refused, naming the two ways to write it.
func scalarText(name string, n *yaml.Node) (string, error) {
	if n.ShortTag() == "!!null" {
		if n.Value == "" {
			return "", nil
		}
		return "", fmt.Errorf("key %s: line %d: an unquoted %s is YAML's null, not text: write '' for an empty value, or quote it ('%s') for the text", name, n.Line, n.Value, n.Value)
	}
	return n.Value, nil
}
