package config

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/format/schemafirst"
	"github.com/walrelay/walrelay/sink/record"
)

// schemaFirstKeys declares the keys of the schema-first value formats
// (registered_avro, registered_protobuf, registered_jsonschema).
func schemaFirstKeys(c *Config, add func(name, help string, f func(string) error, s func() string) *key) {
	r := &c.Kafka.SchemaRegistry
	f, s := str(&r.SubjectStrategy, "")
	add("kafka.schema_registry.subject_strategy", "the subject of an event's schema. In the schema-first formats: `type` (the event's type; the default), `topic_type` (`<topic>-<type>`), or `subject` (`kafka.schema_registry.subject` for every event); an event without a type under `type` or `topic_type` is dead-lettered (`schema_refused`). walrelay registers none of these schemas unless `kafka.schema_registry.auto_register` is on and `kafka.schema_registry.subjects` names their files. In `registry_passthrough`, the subject that a value's schema id must be a version of, else the event is dead-lettered (`schema_unknown`, naming the subject and the id's subjects): `topic` (`<topic>-value`, Confluent's TopicNameStrategy; the default), `type`, `topic_type`, `subject` as above, or `any` (the id only has to exist: an application framing with the schemas of subjects that none of these names, such as Confluent's RecordNameStrategy)", f, s)
	f, s = str(&r.Subject, "")
	add("kafka.schema_registry.subject", "the subject of `kafka.schema_registry.subject_strategy` `subject`", f, s)
	f, s = str(&r.Version, "latest")
	add("kafka.schema_registry.version", "the version of `kafka.schema_registry.subject` to write in: `latest` (read again every minute, and at once when a payload does not fit the one known, at most once every 10 seconds per subject, such payloads within them dead-lettered against the version known; a registry not answering then holds the event) or a number; the other strategies use each subject's latest", f, s)
	f, s = str(&r.Message, "")
	add("kafka.schema_registry.message", "`registered_protobuf`: the message to write, by full (`shop.OrderCreated`) or simple name, nested ones included, in every subject's schema; empty: each schema's first message", f, s)
	f, s = list(&r.Subjects, nil)
	add("kafka.schema_registry.subjects", "subjects that `walrelay check` verifies, comma-separated, with the strategies `type` and `topic_type` (the event types, or `<topic>-<type>`, that the outbox writes): each must exist in the registry with a schema of the format's kind that walrelay compiles; with `subject`, check verifies that one. An entry `subject=path` names the file of the subject's schema (`.avsc`, `.proto` or JSON Schema text, of the format's kind; without references): with `kafka.schema_registry.auto_register: true` walrelay registers it at start, before any event (a new version if the subject does not hold it yet), and stops if the registry refuses it; `walrelay check` says what would be registered", f, s)
}

// schemaFirstFormat reports whether the value format is a schema-first
// one, and its kind of schema.
func (c *Config) schemaFirstFormat() (kind string, ok bool) {
	return record.Format(c.Kafka.ValueFormat).SchemaFirst()
}

// checkSchemaFirst checks the keys of the schema-first formats.
func (c *Config) checkSchemaFirst() error {
	r := c.Kafka.SchemaRegistry
	if _, ok := record.Format(c.Kafka.KeyFormat).SchemaFirst(); ok {
		return fmt.Errorf("kafka.key_format %s: the schema-first formats are for values (the key is the aggregate id, a string): want raw, json, json_schema or avro", c.Kafka.KeyFormat)
	}
	version, err := schemafirst.ParseVersion(r.Version)
	if err != nil {
		return fmt.Errorf("kafka.schema_registry.version: %w", err)
	}
	if err := c.checkSchemaFiles(); err != nil {
		return err
	}
	if c.Kafka.ValueFormat == string(record.FormatRegistryPassthrough) {
		if err := format.CheckPassthroughStrategy(r.SubjectStrategy, r.Subject); err != nil {
			return fmt.Errorf("kafka.schema_registry.subject_strategy, subject with kafka.value_format registry_passthrough: %w", err)
		}
		if version != schemafirst.Latest {
			return fmt.Errorf("kafka.schema_registry.version %s with kafka.value_format registry_passthrough: the application's framing names the schema; a version is for the schema-first formats", r.Version)
		}
		return nil
	}
	kind, ok := c.schemaFirstFormat()
	if !ok {
		return nil
	}
	switch {
	case r.URL == "":
		return fmt.Errorf("kafka.value_format %s needs kafka.schema_registry.url", c.Kafka.ValueFormat)
	case r.Message != "" && kind != schemafirst.KindProtobuf:
		return fmt.Errorf("kafka.schema_registry.message %q is for kafka.value_format registered_protobuf, not %s", r.Message, c.Kafka.ValueFormat)
	case c.Kafka.ExpandJSONPayload:
		return fmt.Errorf("kafka.expand_json_payload with kafka.value_format %s: the schema-first formats read the JSON payload by its registered schema", c.Kafka.ValueFormat)
	case c.Kafka.CloudEvents != "":
		// The CloudEvents binding's content-type would say
		// application/json of a value in Avro or Protobuf.
		return fmt.Errorf("kafka.cloudevents with kafka.value_format %s: not supported (content-type application/json would be wrong)", c.Kafka.ValueFormat)
	}
	strategy := r.SubjectStrategy
	if strategy == "" {
		strategy = registry.StrategyType
	}
	if err := schemafirst.CheckStrategy(strategy, r.Subject, version); err != nil {
		return fmt.Errorf("kafka.schema_registry.subject_strategy, subject, version: %w", err)
	}
	if r.SubjectStrategy == registry.StrategySubject && len(r.Subjects) > 0 && !slices.Equal(c.subjectNames(), []string{r.Subject}) {
		return errors.New("kafka.schema_registry.subjects with the subject strategy subject: check verifies kafka.schema_registry.subject; leave subjects empty, or give that subject alone with its file (subject=path)")
	}
	return nil
}

// checkSchemaFiles checks the entries of kafka.schema_registry.subjects:
// a subject, or subject=path, each subject once; files only with a
// schema-first format.
func (c *Config) checkSchemaFiles() error {
	seen := map[string]bool{}
	for _, e := range c.Kafka.SchemaRegistry.Subjects {
		subject, path, withFile := strings.Cut(e, "=")
		if subject == "" || withFile && path == "" {
			return fmt.Errorf("kafka.schema_registry.subjects: %q: want a subject, or subject=path (the file of its schema)", e)
		}
		if seen[subject] {
			return fmt.Errorf("kafka.schema_registry.subjects: %s is given twice", subject)
		}
		seen[subject] = true
		if _, ok := c.schemaFirstFormat(); withFile && !ok {
			return fmt.Errorf("kafka.schema_registry.subjects: schema files (%s) are for the schema-first formats (registered_avro, registered_protobuf, registered_jsonschema), not kafka.value_format %s", e, c.Kafka.ValueFormat)
		}
	}
	return nil
}

// subjectNames are the subjects of kafka.schema_registry.subjects,
// without their files.
func (c *Config) subjectNames() []string {
	var out []string
	for _, e := range c.Kafka.SchemaRegistry.Subjects {
		subject, _, _ := strings.Cut(e, "=")
		out = append(out, subject)
	}
	return out
}

// SchemaFirstSubjects are the subjects that `walrelay check` verifies:
// the configured subject, or kafka.schema_registry.subjects (without
// their files).
func (c *Config) SchemaFirstSubjects() []string {
	r := c.Kafka.SchemaRegistry
	if r.SubjectStrategy == registry.StrategySubject {
		return []string{r.Subject}
	}
	return c.subjectNames()
}

// SchemaFile is a schema that the operator supplies for a subject
// (kafka.schema_registry.subjects' subject=path): registered at start
// with kafka.schema_registry.auto_register.
type SchemaFile struct {
	Subject, Path string
}

// SchemaFiles are the schema files of kafka.schema_registry.subjects, in
// their order.
func (c *Config) SchemaFiles() []SchemaFile {
	var out []SchemaFile
	for _, e := range c.Kafka.SchemaRegistry.Subjects {
		if subject, path, ok := strings.Cut(e, "="); ok {
			out = append(out, SchemaFile{Subject: subject, Path: path})
		}
	}
	return out
}

// ReadSchemaFile reads a schema file's text.
func ReadSchemaFile(f SchemaFile) (string, error) {
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return "", fmt.Errorf("kafka.schema_registry.subjects: the schema of subject %s: %w", f.Subject, err)
	}
	return string(b), nil
}

// SchemaFirst makes the encoder of the schema-first value format, nil for
// another format; its registry is Registry's (TLS included).
func SchemaFirst(c *Config) (*schemafirst.Encoder, error) {
	if _, ok := c.schemaFirstFormat(); !ok {
		return nil, nil
	}
	reg, err := Registry(c)
	if err != nil {
		return nil, err
	}
	return schemaFirstOf(c, reg)
}

// passthroughOf makes the checker of kafka.value_format
// registry_passthrough reading the schemas' subjects from reg, under
// kafka.schema_registry.subject_strategy.
func passthroughOf(c *Config, reg *registry.Client) (*format.Passthrough, error) {
	r := c.Kafka.SchemaRegistry
	pc := format.PassthroughConfig{Strategy: r.SubjectStrategy, Subject: r.Subject}
	if c.Kafka.ValueFormat != string(record.FormatRegistryPassthrough) {
		pc = format.PassthroughConfig{Strategy: format.StrategyAny} // unused: the sink calls it in registry_passthrough only
	}
	p, err := format.NewPassthrough(reg, pc)
	if err != nil {
		return nil, fmt.Errorf("kafka.schema_registry.subject_strategy: %w", err)
	}
	return p, nil
}

// schemaFirstOf makes the encoder of the schema-first value format reading
// its schemas from reg, nil for another format. It registers nothing by
// itself: walrelay's start registers the schema files
// (walrelay run, before any event) when kafka.schema_registry.auto_register is on.
func schemaFirstOf(c *Config, reg *registry.Client) (*schemafirst.Encoder, error) {
	kind, ok := c.schemaFirstFormat()
	if !ok {
		return nil, nil
	}
	r := c.Kafka.SchemaRegistry
	version, err := schemafirst.ParseVersion(r.Version)
	if err != nil {
		return nil, fmt.Errorf("kafka.schema_registry.version: %w", err)
	}
	enc, err := schemafirst.New(reg, schemafirst.Config{Kind: kind, Strategy: r.SubjectStrategy, Subject: r.Subject, Version: version, Message: r.Message})
	if err != nil {
		return nil, fmt.Errorf("kafka.value_format %s: %w", c.Kafka.ValueFormat, err)
	}
	return enc, nil
}
