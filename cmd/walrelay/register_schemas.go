package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/format/schemafirst"
)

// registerSchemaFiles registers the schema files that
// kafka.schema_registry.subjects names (subject=path), with a
// schema-first value format and kafka.schema_registry.auto_register on:
// at start, before any event, and never otherwise. A registry that
// refuses one (incompatible with the subject's rule, invalid) or refuses
// walrelay's credentials, or a file walrelay cannot read or use, stops
// the start with an error naming the subject and the file; a registry
// that does not answer is waited for (retried with backoff, each failure
// logged), as events are held while it is down. It returns nil when ctx
// is cancelled meanwhile.
func registerSchemaFiles(ctx context.Context, cfg *config.Config, sf *schemafirst.Encoder, log *slog.Logger) error {
	if sf == nil || !cfg.Kafka.SchemaRegistry.AutoRegister {
		return nil
	}
	for _, f := range cfg.SchemaFiles() {
		text, err := config.ReadSchemaFile(f)
		if err != nil {
			return err
		}
		backoff := time.Second
		for {
			got, err := sf.Register(ctx, f.Subject, text)
			if err == nil {
				log.Info("schema registered (kafka.schema_registry.auto_register)", "subject", f.Subject, "version", got.Version, "id", got.ID, "file", f.Path)
				if got.Latest != got.Version {
					log.Warn("the schema file is an older version of its subject, which the registry does not register again: the subject's latest version is another", "subject", f.Subject, "version", got.Version, "latest", got.Latest, "file", f.Path)
				}
				break
			}
			if ctx.Err() != nil {
				return nil
			}
			if !registry.Outage(err) {
				return fmt.Errorf("register the schema file %s (kafka.schema_registry.subjects): %w", f.Path, err)
			}
			log.Warn("the schema registry is not answering: walrelay registers the schema files before it streams, and retries",
				"subject", f.Subject, "file", f.Path, "retry_in", backoff, "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 30*time.Second)
		}
	}
	return nil
}
