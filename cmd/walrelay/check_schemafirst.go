package main

import (
	"context"
	"fmt"
	"time"

	"github.com/walrelay/walrelay/config"
)

// checkSchemaFirst checks, for a schema-first value format, each subject
// that the configuration names (kafka.schema_registry.subject, or
// kafka.schema_registry.subjects): that it exists at the configured
// version, with a schema of the format's kind that walrelay compiles (and,
// for Protobuf, holds the configured message). With the strategies type
// and topic_type and no subjects listed, it warns that none was checked.
func checkSchemaFirst(ctx context.Context, cfg *config.Config) []checkResult {
	sf, err := config.SchemaFirst(cfg)
	if err != nil {
		return []checkResult{{Check: "schema subjects", Status: "fail", Detail: config.ScrubError(err, cfg.Secrets()).Error()}}
	}
	if sf == nil {
		return nil
	}
	subjects := cfg.SchemaFirstSubjects()
	if len(subjects) == 0 {
		strategy, _ := sf.Strategy()
		return []checkResult{{Check: "schema subjects", Status: "warn", Detail: fmt.Sprintf("none checked: with the subject strategy %s, list the subjects the outbox writes (the event types, or <topic>-<type>) in kafka.schema_registry.subjects", strategy)}}
	}
	var out []checkResult
	for _, subject := range subjects {
		r := checkResult{Check: "schema subject " + subject}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		id, version, err := sf.Check(sctx, subject)
		cancel()
		if err != nil {
			r.Status, r.Detail = "fail", config.ScrubError(err, cfg.Secrets()).Error()
		} else {
			r.Status, r.Detail = "ok", fmt.Sprintf("version %d, id %d, for %s", version, id, cfg.Kafka.ValueFormat)
		}
		out = append(out, r)
	}
	return out
}
