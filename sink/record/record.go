package record

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/format"
)

// Config is what an event's record follows. Zero values mean the defaults.
// The sink's Config holds the same fields, documented there.
type Config struct {
	// Topic is the topic template, or with TopicRegex the replacement.
	// Default "outbox.event.{aggregatetype}".
	Topic, TopicRegex string
	// Routes route the events of some outbox tables (Event.Source)
	// otherwise.
	Routes map[string]Route
	// AllowedTopics confine the topics an event may be routed to (an
	// entry ending in * is a prefix); empty: any topic but the reserved
	// ones.
	AllowedTopics []string
	// DLQTopic, OffsetsTopic and ReservedTopics are walrelay's own topics,
	// never an event's, whatever AllowedTopics says; so are walrelay's
	// default topic names and Kafka's internal ones (__…).
	DLQTopic, OffsetsTopic string
	ReservedTopics         []string
	// TombstoneOnEmpty makes a NULL or blank payload a tombstone.
	TombstoneOnEmpty bool
	// CloudEvents is "binary" or empty; CloudEventsSource is ce_source, in
	// which {table} is replaced by the event's table.
	CloudEvents, CloudEventsSource string
	// OmitHeaders are headers of OptionalHeaders that records leave out.
	OmitHeaders []string
	// KeyFormat and ValueFormat are how the key and the value are written.
	// Default FormatRaw. The registry formats (Format.Registry,
	// FormatRegistryPassthrough) are written by the sink, not here.
	KeyFormat, ValueFormat Format
	// ExpandJSONPayload writes a JSON payload as its JSON value in the
	// JSON formats.
	ExpandJSONPayload bool
}

// Builder makes events into records by a Config. Its methods are safe for
// concurrent use.
type Builder struct {
	cfg     Config
	route   *route            // Topic and TopicRegex
	routes  map[string]*route // Routes; nil if none
	rules   *topicRules       // where events may go (confine.go)
	ceTable int               // index of {table} in CloudEventsSource, or -1
	omit    [len(OptionalHeaders)]bool

	mu   sync.Mutex // guards last
	last txnHeaders // the texts of the last transaction's headers
}

// New checks cfg, fills its defaults and returns its Builder.
func New(cfg Config) (*Builder, error) {
	if cfg.Topic == "" {
		cfg.Topic = "outbox.event.{aggregatetype}"
	}
	if cfg.KeyFormat == "" {
		cfg.KeyFormat = FormatRaw
	}
	if cfg.ValueFormat == "" {
		cfg.ValueFormat = FormatRaw
	}
	rt, err := newRoute(cfg.Topic, cfg.TopicRegex)
	if err != nil {
		return nil, err
	}
	rules, err := newTopicRules(cfg)
	if err != nil {
		return nil, err
	}
	var routes map[string]*route
	for table, r := range cfg.Routes {
		if routes == nil {
			routes = map[string]*route{}
		}
		if routes[table], err = newRoute(r.Topic, r.TopicRegex); err != nil {
			return nil, fmt.Errorf("table %s: %w", table, err)
		}
	}
	switch {
	case cfg.CloudEvents != "" && cfg.CloudEvents != "binary":
		return nil, fmt.Errorf("cloudevents %q: want binary, or empty for none", cfg.CloudEvents)
	case cfg.CloudEvents != "" && cfg.CloudEventsSource == "":
		return nil, errors.New("cloudevents: a source (ce_source) is required")
	}
	omit, err := omitted(cfg.OmitHeaders)
	if err != nil {
		return nil, err
	}
	return &Builder{cfg: cfg, route: rt, routes: routes, rules: rules, ceTable: strings.Index(cfg.CloudEventsSource, "{table}"), omit: omit}, nil
}

// Route returns the topic e is routed to and the template (or regex
// replacement) that made it, for an error about the topic.
func (b *Builder) Route(e *event.Event) (topic, template string) {
	rt := b.routeOf(e)
	return rt.topic(e), rt.template
}

// routeOf is the route of e's table.
func (b *Builder) routeOf(e *event.Event) *route {
	if b.routes != nil {
		if r, ok := b.routes[e.Source]; ok {
			return r
		}
	}
	return b.route
}

// Routed reports whether e holds every field its route reads (the
// aggregate type, the type): of an event too large to keep, whose fields
// past the head that was read are empty, only then is Topic the topic it
// was going to.
func (b *Builder) Routed(e *event.Event) bool {
	rt := b.routeOf(e)
	if rt.router != nil {
		return e.AggregateType != ""
	}
	for i := 1; i < len(rt.parts); i += 2 {
		if field(rt.parts[i], e) == "" {
			return false
		}
	}
	return true
}

// Topic returns the topic e is routed to.
func (b *Builder) Topic(e *event.Event) string {
	t, _ := b.Route(e)
	return t
}

// Record returns e's record to topic, its key and value as stored: Topic,
// Partition -1 (none assigned), the raw key, the payload, the headers
// (Headers, and the CloudEvents ones), and e's Time as the timestamp
// (zero if it has none: the caller stamps it). Encode writes the key and
// value in their formats. An event that the configuration cannot make a
// record of (a CloudEvent without a type) is an error.
func (b *Builder) Record(e *event.Event, topic string) (*kgo.Record, error) {
	if b.cfg.CloudEvents != "" && e.Type == "" {
		return nil, errors.New("the event has no type, which a CloudEvent requires (ce_type)")
	}
	extra := 0
	if b.cfg.CloudEvents != "" {
		extra = ceHeaders
	}
	h := b.Headers(e, extra)
	if extra > 0 {
		h = b.cloudEventHeaders(h, e)
	}
	return &kgo.Record{Topic: topic, Partition: -1, Key: readOnly(e.AggregateID), Value: e.Payload, Headers: h, Timestamp: e.Time}, nil
}

// Encode writes r's key and value, from Record, in the configured JSON
// formats (a blank payload a tombstone with TombstoneOnEmpty), the payload
// expanded with ExpandJSONPayload to at most maxBytes (0: no bound; past
// it, ErrExpandedTooLarge). The registry formats are left as they are:
// the sink writes them before. Any other error is of a payload the format
// cannot write (one nesting deeper than Jackson writes).
func (b *Builder) Encode(e *event.Event, r *kgo.Record, maxBytes int) error {
	if b.cfg.KeyFormat != FormatRaw && b.cfg.KeyFormat != FormatAvro {
		r.Key = b.cfg.KeyFormat.encodeKey(r.Key, KeyColumn(e))
	}
	vf := b.cfg.ValueFormat
	switch {
	case b.cfg.TombstoneOnEmpty && Blank(e.Payload):
		r.Value = nil
	case vf.Registry(), vf == FormatRegistryPassthrough, vf == FormatRaw:
	case e.PayloadBytes:
		r.Value = vf.encodeBytes(r.Value, valueSchema(e))
	default:
		v, ok, err := b.expand(e, maxBytes)
		switch {
		case err != nil:
			return err
		case ok:
			r.Value = v
		default:
			r.Value = vf.encode(r.Value, valueSchema(e))
		}
	}
	return nil
}

// KeyColumn is what the formats need of e's aggregate id column.
func KeyColumn(e *event.Event) format.KeyColumn {
	return format.KeyColumn{Type: e.AggregateIDType, Nullable: e.AggregateIDNullable}
}

// CheckKeyColumn refuses an aggregate id column c whose key key format f
// cannot write as Debezium does: in avro, a column of a type without a
// known Connect schema (format.KeySchemaOf).
func CheckKeyColumn(f Format, c format.KeyColumn) error {
	if f != FormatAvro {
		return nil
	}
	if _, err := format.KeySchemaOf(c); err != nil {
		return fmt.Errorf("kafka.key_format %s: %w (the key would not be Debezium's)", f, err)
	}
	return nil
}
