package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/walrelay/walrelay/cmd/walrelay/internal/admin"
	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/sink"
)

// watchRegistry has the schema registry of sc's registry formats, if any,
// report each request to m: its metric, status and log lines.
func watchRegistry(sc sink.Config, m *admin.Metrics) {
	if reg := config.RegistryOf(sc); reg != nil {
		m.UseRegistry()
		reg.OnRequest(m.RegistryRequest)
	}
}

// pingRegistry asks the schema registry of sc's registry formats, if any,
// for its subjects before walrelay streams: a URL that answers, but not
// as Confluent's Schema Registry API does (a wrong path: every request
// would be held for ever), stops walrelay with an error naming
// kafka.schema_registry.url. A registry that does not answer, or refuses
// the credentials to that request, is logged and walrelay starts: the
// events wait for it as in any outage (and credentials refused to an
// event's own request stop walrelay then).
func pingRegistry(ctx context.Context, sc sink.Config, log *slog.Logger) error {
	reg := config.RegistryOf(sc)
	if reg == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := reg.Ping(pctx)
	switch {
	case err == nil || ctx.Err() != nil:
		return nil
	case errors.Is(err, registry.ErrNotSchemaRegistry):
		return fmt.Errorf("kafka.schema_registry.url: %w", err)
	case errors.Is(err, registry.ErrUnauthorized):
		log.Warn("the schema registry refuses walrelay's credentials to list its subjects at start: walrelay starts, and stops if it refuses them for an event's schema (kafka.schema_registry.username and its password)", "err", err)
	default:
		log.Warn("the schema registry does not answer at start: walrelay starts, and holds the events it cannot encode or check until it answers; nothing is dropped", "err", err)
	}
	return nil
}
