package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/format"
)

// FormatRegistryPassthrough is a value that the application already
// encoded and framed in Confluent's wire format (Debezium's Avro recipe: a
// bytea payload passed through by the ByteArrayConverter), published as it
// is once its framing is checked and its schema id found in the registry,
// a version of the value's subject (package format, Passthrough). Values
// only.
const FormatRegistryPassthrough Format = "registry_passthrough"

// ReasonSchemaUnknown is the dead-letter reason of a framed payload whose
// schema id the registry does not have, or has only in other subjects than
// the value's (FormatRegistryPassthrough; the error names both); one not
// framed at all is ReasonFormat.
const ReasonSchemaUnknown = "schema_unknown"

// passthrough checks r's value in FormatRegistryPassthrough and reports
// whether r is to be published, as registryEncode does: a payload not
// framed, or of a schema id unknown or of another subject, is
// dead-lettered; a registry
// refusing the credentials is fatal; one not answering is transient.
func (s *Sink) passthrough(ctx context.Context, e *event.Event, r *kgo.Record, topic string, gen uint64, done Done) bool {
	if s.cfg.TombstoneOnEmpty && blank(e.Payload) {
		return true
	}
	err := s.cfg.Passthrough.Check(ctx, topic, e.Type, r.Value)
	switch {
	case err == nil:
		return true
	case errors.Is(err, format.ErrUnframed):
		s.deadLetter(ctx, e, ReasonFormat, topic, fmt.Errorf("the value: %w", err), gen, done)
	case errors.Is(err, format.ErrSchemaUnknown):
		s.deadLetter(ctx, e, ReasonSchemaUnknown, topic, fmt.Errorf("the value: %w", err), gen, done)
	case errors.Is(err, format.ErrUnauthorized):
		s.q.breakOn(err)
		done(Delivery{Topic: topic, Partition: -1}, failure.Mark(failure.Fatal, fmt.Errorf("publish event %s to %s: the value's schema: %w: fix kafka.schema_registry.username and its password", e.ID, topic, err)))
	default:
		s.q.breakOn(err)
		done(Delivery{Topic: topic, Partition: -1}, failure.Mark(failure.Retriable, fmt.Errorf("publish event %s to %s: the value's schema: %w", e.ID, topic, err)))
	}
	return false
}
