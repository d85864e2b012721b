package config

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// YAML renders the effective configuration as a YAML file that walrelay
// reads back, secrets redacted, each value followed by where it came from:
// default, the file (--config), the environment (its variable) or a flag.
func (cs *Set) YAML() (string, error) {
	root := &yaml.Node{Kind: yaml.MappingNode}
	for _, k := range cs.keys {
		if k.name == "postgres.table" && len(cs.cfg.Outbox.Tables) > 0 {
			continue // not in effect: outbox.tables lists the tables
		}
		m := root
		parts := strings.Split(k.name, ".")
		for _, part := range parts[:len(parts)-1] {
			m = child(m, part)
		}
		v := k.show()
		if k.redact != nil {
			v = k.redact(v)
		}
		from := k.setFrom
		switch from {
		case "file":
			from = "from " + *cs.file
		case "env":
			from = "from " + EnvName(k.name)
		case "flag":
			from = "from --" + k.name
		}
		if k.name == "postgres.dsn" && v != "" {
			from += "; as parsed, without its password, passfile and TLS files"
		}
		val := &yaml.Node{Kind: yaml.ScalarNode, Value: v, LineComment: from}
		if v == "" || strings.ContainsAny(v, ":#{}[],&*!|>'\"%@`") || strings.TrimSpace(v) != v {
			val.Style = yaml.DoubleQuotedStyle
		}
		m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: parts[len(parts)-1]}, val)
	}
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{root}}); err != nil {
		return "", fmt.Errorf("render the configuration: %w", err)
	}
	return b.String(), nil
}

// child returns the mapping under key in mapping m, adding it if missing.
func child(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	c := &yaml.Node{Kind: yaml.MappingNode}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, c)
	return c
}

// Summary is the start-up log line's part of the configuration: where
// events come from and go to, secrets redacted. walrelay config prints
// the rest.
func (cs *Set) Summary() []any {
	c := &cs.cfg
	attrs := []any{"source", c.Source}
	if c.Source == "wal" {
		attrs = append(attrs, "slot", c.Postgres.Slot, "publication", c.Postgres.Publication)
	}
	tables := c.Postgres.Table
	if len(c.Outbox.Tables) > 0 {
		names := make([]string, len(c.Outbox.Tables))
		for i, t := range c.Outbox.Tables {
			names[i] = t.Table
		}
		tables = strings.Join(names, ",")
	}
	return append(attrs, "postgres", RedactDSN(c.Postgres.DSN), "tables", tables, "kafka", strings.Join(c.Kafka.Brokers, ","),
		"topic", c.Kafka.Topic, "exactly_once", c.Kafka.ExactlyOnce, "admin", c.Admin.Listen)
}

// Effective renders the configuration for the start-up log, secrets
// redacted.
func (cs *Set) Effective() []any {
	var attrs []any
	for _, k := range cs.keys {
		v := k.show()
		if k.redact != nil {
			v = k.redact(v)
		}
		attrs = append(attrs, k.name, v)
	}
	return attrs
}
