package config

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// DebeziumYAML renders keys as a walrelay configuration file, grouped and
// ordered as walrelay's keys are.
func DebeziumYAML(in map[string]string) (string, error) {
	keys := make(map[string]string, len(in))
	for k, v := range in {
		keys[k] = v
	}
	var c Config
	root := &yaml.Node{Kind: yaml.MappingNode}
	groups := map[string]*yaml.Node{}
	for _, k := range c.keys() {
		v, ok := keys[k.name]
		if !ok {
			continue
		}
		if err := k.set(v); err != nil {
			return "", fmt.Errorf("%s: %w", k.name, err)
		}
		parts := strings.Split(k.name, ".")
		parent := root
		for i, p := range parts[:len(parts)-1] {
			path := strings.Join(parts[:i+1], ".")
			g := groups[path]
			if g == nil {
				g = &yaml.Node{Kind: yaml.MappingNode}
				groups[path] = g
				parent.Content = append(parent.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: p}, g)
			}
			parent = g
		}
		var val *yaml.Node
		if k.structured {
			var doc yaml.Node
			if err := yaml.Unmarshal([]byte(v), &doc); err != nil || len(doc.Content) != 1 {
				return "", fmt.Errorf("%s: %v", k.name, err)
			}
			val = doc.Content[0]
			blockStyle(val)
		} else if strings.Contains(k.help, "comma-separated") {
			val = &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
			for _, x := range strings.Split(v, ",") {
				val.Content = append(val.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: strings.TrimSpace(x)})
			}
		} else {
			val = &yaml.Node{Kind: yaml.ScalarNode, Value: v}
		}
		parent.Content = append(parent.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: parts[len(parts)-1]}, val)
		delete(keys, k.name)
	}
	if len(keys) > 0 {
		return "", fmt.Errorf("keys walrelay does not have: %v", keys)
	}
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return "", err
	}
	return b.String(), enc.Close()
}

// blockStyle renders n and what it holds in YAML's block style, but for
// lists of plain values.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	if n.Kind == yaml.SequenceNode && len(n.Content) > 0 && n.Content[0].Kind == yaml.ScalarNode {
		n.Style = yaml.FlowStyle
	}
	for _, c := range n.Content {
		blockStyle(c)
	}
}
