package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/sink/record"
)

// OutboxTable is one entry of outbox.tables: an outbox table with its own
// layout and routing. An empty field takes the value of the top-level key
// of its name (outbox.id_column, …, kafka.topic); an entry that sets topic
// routes by its own topic and topic_regex. header_columns: [] gives the
// table no header columns whatever outbox.header_columns says.
type OutboxTable struct {
	Table               string   `yaml:"table" json:"table"`
	IDColumn            string   `yaml:"id_column" json:"id_column,omitempty"`
	AggregateTypeColumn string   `yaml:"aggregate_type_column" json:"aggregate_type_column,omitempty"`
	AggregateIDColumn   string   `yaml:"aggregate_id_column" json:"aggregate_id_column,omitempty"`
	TypeColumn          string   `yaml:"type_column" json:"type_column,omitempty"`
	PayloadColumn       string   `yaml:"payload_column" json:"payload_column,omitempty"`
	HeaderColumns       []string `yaml:"header_columns" json:"header_columns,omitempty"`
	TimestampColumn     string   `yaml:"timestamp_column" json:"timestamp_column,omitempty"`
	OrderColumn         string   `yaml:"order_column" json:"order_column,omitempty"`
	PartitionColumn     string   `yaml:"partition_column" json:"partition_column,omitempty"`
	TraceColumn         string   `yaml:"trace_column" json:"trace_column,omitempty"`
	VersionColumn       string   `yaml:"version_column" json:"version_column,omitempty"`
	Topic               string   `yaml:"topic" json:"topic,omitempty"`
	TopicRegex          string   `yaml:"topic_regex" json:"topic_regex,omitempty"`
}

// tables is the setter and shower of outbox.tables: YAML (JSON is YAML) in,
// JSON out; unknown fields are refused.
func tables(p *[]OutboxTable) (func(string) error, func() string) {
	*p = nil
	return func(v string) error {
		*p = nil
		if strings.TrimSpace(v) == "" {
			return nil
		}
		dec := yaml.NewDecoder(strings.NewReader(v))
		dec.KnownFields(true)
		var ts []OutboxTable
		if err := dec.Decode(&ts); err != nil {
			return fmt.Errorf("want a list of tables, each with table and any of %s: %w", tableFields, err)
		}
		*p = ts
		return nil
	}, func() string { return tablesJSON(*p) }
}

// tablesJSON is the JSON text of outbox.tables, empty for none.
func tablesJSON(ts []OutboxTable) string {
	if len(ts) == 0 {
		return ""
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(ts) // strings and lists of strings only
	return strings.TrimSpace(b.String())
}

// tableFields names the fields of an outbox.tables entry.
const tableFields = "id_column, aggregate_type_column, aggregate_id_column, type_column, payload_column, header_columns, timestamp_column, order_column, partition_column, trace_column, version_column, topic, topic_regex"

// splitTable splits schema.table; a bare name is in public.
func splitTable(s string) (schema, name string, ok bool) {
	parts := strings.Split(s, ".")
	switch {
	case len(parts) == 1 && parts[0] != "":
		return "public", parts[0], true
	case len(parts) == 2 && parts[0] != "" && parts[1] != "":
		return parts[0], parts[1], true
	}
	return "", "", false
}

// checkTables checks each entry of outbox.tables alone and against the
// others.
func (c *Config) checkTables() error {
	seen := map[string]bool{}
	for i, t := range c.Outbox.Tables {
		schema, name, ok := splitTable(t.Table)
		if !ok {
			return fmt.Errorf("outbox.tables entry %d: table %q: want schema.table", i+1, t.Table)
		}
		if seen[schema+"."+name] {
			return fmt.Errorf("outbox.tables: table %s is listed twice", schema+"."+name)
		}
		seen[schema+"."+name] = true
		if t.TopicRegex != "" && t.Topic == "" {
			return fmt.Errorf("outbox.tables entry %s: topic_regex needs topic, its replacement", t.Table)
		}
		if t.Topic != "" {
			if err := record.CheckRouting(t.Topic, t.TopicRegex); err != nil {
				return fmt.Errorf("outbox.tables entry %s: topic, topic_regex: %w", t.Table, err)
			}
		}
	}
	return nil
}

// layout is the decoder's layout of the entry, its empty fields taken from
// base.
func (t OutboxTable) layout(base decoder.Layout) decoder.Layout {
	l := base
	l.Schema, l.Table, _ = splitTable(t.Table)
	pick := func(p *string, v string) {
		if v != "" {
			*p = v
		}
	}
	pick(&l.Columns.ID, t.IDColumn)
	pick(&l.Columns.AggregateType, t.AggregateTypeColumn)
	pick(&l.Columns.AggregateID, t.AggregateIDColumn)
	pick(&l.Columns.Type, t.TypeColumn)
	pick(&l.Columns.Payload, t.PayloadColumn)
	pick(&l.TimestampColumn, t.TimestampColumn)
	pick(&l.OrderColumn, t.OrderColumn)
	pick(&l.PartitionColumn, t.PartitionColumn)
	pick(&l.TraceColumn, t.TraceColumn)
	pick(&l.VersionColumn, t.VersionColumn)
	if t.HeaderColumns != nil {
		l.HeaderColumns, l.HeaderNames = headerColumns(t.HeaderColumns)
	}
	return l
}
