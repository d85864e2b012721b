package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/format/schemafirst"
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
	files := map[string]string{}
	for _, f := range cfg.SchemaFiles() {
		files[f.Subject] = f.Path
	}
	var out []checkResult
	for _, subject := range subjects {
		r := checkResult{Check: "schema subject " + subject}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if path, ok := files[subject]; ok {
			r.Status, r.Detail = checkSchemaFile(sctx, cfg, sf, config.SchemaFile{Subject: subject, Path: path})
		} else if id, version, err := sf.Check(sctx, subject); err != nil {
			r.Status, r.Detail = "fail", err.Error()
		} else {
			r.Status, r.Detail = "ok", fmt.Sprintf("version %d, id %d, for %s", version, id, cfg.Kafka.ValueFormat)
		}
		cancel()
		r.Detail = config.ScrubError(errors.New(r.Detail), cfg.Secrets()).Error()
		out = append(out, r)
	}
	return out
}

// checkSchemaFile says what walrelay's start would do with a subject's
// schema file, registering nothing: with auto_register, that the subject
// holds it already, or that it would be registered (a new version, or a
// new subject), or why the registry would refuse it; without, whether the
// subject is usable, and that the file is not registered if it is not.
func checkSchemaFile(ctx context.Context, cfg *config.Config, sf *schemafirst.Encoder, f config.SchemaFile) (status, detail string) {
	text, err := config.ReadSchemaFile(f)
	if err != nil {
		return "fail", err.Error()
	}
	plan, planErr := sf.Plan(ctx, f.Subject, text)
	if cfg.Kafka.SchemaRegistry.AutoRegister {
		if planErr != nil {
			return "fail", fmt.Sprintf("%s: %v", f.Path, planErr)
		}
		return "ok", fmt.Sprintf("%s: %s (kafka.schema_registry.auto_register)", f.Path, plan)
	}
	id, version, err := sf.Check(ctx, f.Subject)
	switch {
	case err != nil:
		return "fail", fmt.Sprintf("%v; %s is not registered: kafka.schema_registry.auto_register is false, and walrelay registers nothing", err, f.Path)
	case planErr == nil && strings.HasPrefix(plan, "registered already"):
		return "ok", fmt.Sprintf("version %d, id %d, for %s; %s: %s", version, id, cfg.Kafka.ValueFormat, f.Path, plan)
	}
	return "warn", fmt.Sprintf("version %d, id %d, for %s; %s is not registered under the subject, and kafka.schema_registry.auto_register is false: walrelay will not register it", version, id, cfg.Kafka.ValueFormat, f.Path)
}
