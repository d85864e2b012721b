package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/sink/record"
)

// ReasonSchemaUnknown is the dead-letter reason of a framed payload whose
// schema id the registry does not have, or has only in other subjects than
// the value's (record.FormatRegistryPassthrough; the error names both); one not
// framed at all is ReasonFormat.
const ReasonSchemaUnknown = "schema_unknown"

// passthrough checks r's value in record.FormatRegistryPassthrough and reports
// whether r is to be published, as registryEncode does: a payload not
// framed, or of a schema id unknown or of another subject, is
// dead-lettered; a registry
// refusing the credentials is fatal; one not answering is transient.
func (s *Sink) passthrough(ctx context.Context, e *event.Event, r *kgo.Record, topic string, gen uint64, done Done) bool {
	if s.cfg.TombstoneOnEmpty && record.Blank(e.Payload) {
		return true
	}
	err := s.cfg.Passthrough.Check(ctx, topic, e.Type, r.Value)
	switch {
	case err == nil:
		return true
	case errors.Is(err, format.ErrUnframed):
		s.deadLetter(ctx, e, ReasonFormat, topic, fmt.Errorf("the value: %w", err), gen, done)
	case errors.Is(err, registry.ErrSchemaUnknown):
		s.deadLetter(ctx, e, ReasonSchemaUnknown, topic, fmt.Errorf("the value: %w", err), gen, done)
	case errors.Is(err, registry.ErrUnauthorized):
		s.q.BreakOn(err)
		done(Delivery{Topic: topic, Partition: -1}, failure.Mark(failure.Fatal, fmt.Errorf("publish event %s to %s: the value's schema: %w: fix kafka.schema_registry.username and its password", e.ID, topic, err)))
	default:
		s.q.BreakOn(err)
		done(Delivery{Topic: topic, Partition: -1}, failure.Mark(failure.Retriable, fmt.Errorf("publish event %s to %s: the value's schema: %w", e.ID, topic, err)))
	}
	return false
}
