package schemafirst

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/lru"
)

// Schema-first formats: the application writes JSON, and walrelay writes it
// in the schema that a schema registry already holds for the event (its
// type, or its topic and type, or one configured subject), in Confluent's
// wire format. Nothing is inferred and, by default, nothing registered.
const (
	// KindAvro is Avro: the JSON converted by the schema (avro.go's
	// encoding, github.com/hamba/avro/v2).
	KindAvro = "AVRO"
	// KindProtobuf is Protobuf: the JSON read as protojson reads it into
	// the schema's message, written with Confluent's message indexes.
	KindProtobuf = "PROTOBUF"
	// KindJSONSchema is JSON Schema: the JSON validated, written as it is.
	KindJSONSchema = "JSON"
)

// Latest is the version that names a subject's latest schema.
const Latest = -1

// Config is what a schema-first encoder writes and where it
// finds its schemas.
type Config struct {
	// Kind is KindAvro, KindProtobuf or KindJSONSchema. Required.
	Kind string
	// Strategy is StrategyType (the default), StrategyTopicType or
	// StrategySubject.
	Strategy string
	// Subject is the subject of StrategySubject.
	Subject string
	// Version is the subject's version to use; Latest (or 0) for its
	// latest, read again every LatestTTL.
	Version int
	// Message is the Protobuf message to write, by full or simple name;
	// default the schema's first message.
	Message string
	// LatestTTL is how long a subject's latest schema is used before it is
	// read again. Default 1 minute.
	LatestTTL time.Duration
	// MismatchReadInterval bounds the reading again of a subject's latest
	// schema that a payload not fitting it causes. Such a payload makes
	// walrelay read the latest again first (a new version registered
	// meanwhile, whose payloads come at once), at most once per subject
	// every MismatchReadInterval, whatever the payloads: a mismatch within
	// the interval is decided against the schema known, without a
	// request, so that rows that do not fit cost a registry request and a
	// compilation of the schema (tens of milliseconds for a large one)
	// once per interval, not once each. If the registry does not answer
	// that reading, the payload is held (an outage), and so are the
	// mismatches within the interval after it. Default 10 seconds.
	MismatchReadInterval time.Duration
	// UnusableReadInterval bounds the reading of a subject whose schema
	// cannot be used: a subject the registry lacks, a schema that does
	// not compile, of another kind than Kind, or that references what
	// the registry lacks (ErrNotRegistered). Once a reading finds it so,
	// the subject's events within the interval get the same error (and
	// go to the dead-letter topic, as the first did) without a request,
	// so that events of such subjects cost a registry request (and a
	// compilation) once per subject every UnusableReadInterval, not once
	// each; a schema registered or mended meanwhile is used from the
	// first event after the interval. Check (walrelay check) always asks
	// the registry. Default 10 seconds.
	UnusableReadInterval time.Duration
}

// DefaultMismatchReadInterval is Config.MismatchReadInterval's
// default.
const DefaultMismatchReadInterval = 10 * time.Second

// Encoder writes JSON payloads in the schema registered for their
// event. It is safe for concurrent use.
type Encoder struct {
	reg *registry.Client
	cfg Config
	mu  sync.Mutex
	// schemas caches the compiled schema of each subject and version;
	// size is their CompiledSize in all (at most MaxCachedSchemaBytes).
	// When full, the least recently used (schemasUsed) is dropped, one
	// at a time.
	schemas     map[subjectVersion]*compiledSchema
	size        int
	schemasUsed lru.Order[subjectVersion]
	// reads holds what each subject's last readings were (subjectReads):
	// apart from the schemas, so that a subject dropped from their cache
	// keeps its bounds. At most maxSubjectReads of them, the least
	// recently used (readsUsed) dropped first.
	reads     map[subjectVersion]*subjectReads
	readsUsed lru.Order[subjectVersion]
	// now is the clock of LatestTTL and MismatchReadInterval (time.Now;
	// a test's own).
	now func() time.Time
}

// New returns an encoder reading its schemas from reg.
func New(reg *registry.Client, cfg Config) (*Encoder, error) {
	switch cfg.Kind {
	case KindAvro, KindProtobuf, KindJSONSchema:
	default:
		return nil, fmt.Errorf("schema-first format %q: want %s, %s or %s", cfg.Kind, KindAvro, KindProtobuf, KindJSONSchema)
	}
	if cfg.Strategy == "" {
		cfg.Strategy = registry.StrategyType
	}
	if err := CheckStrategy(cfg.Strategy, cfg.Subject, cfg.Version); err != nil {
		return nil, err
	}
	if cfg.Version == 0 {
		cfg.Version = Latest
	}
	if cfg.Message != "" && cfg.Kind != KindProtobuf {
		return nil, fmt.Errorf("a Protobuf message %q for format %s", cfg.Message, cfg.Kind)
	}
	if cfg.LatestTTL <= 0 {
		cfg.LatestTTL = time.Minute
	}
	if cfg.MismatchReadInterval <= 0 {
		cfg.MismatchReadInterval = DefaultMismatchReadInterval
	}
	if cfg.UnusableReadInterval <= 0 {
		cfg.UnusableReadInterval = registry.DefaultUnusableReadInterval
	}
	return &Encoder{reg: reg, cfg: cfg, schemas: map[subjectVersion]*compiledSchema{}, reads: map[subjectVersion]*subjectReads{}, now: time.Now}, nil
}

// CheckStrategy checks a subject strategy with its subject and version
// (0 or Latest: the latest).
func CheckStrategy(strategy, subject string, version int) error {
	switch strategy {
	case "", registry.StrategyType, registry.StrategyTopicType:
		if subject != "" {
			return fmt.Errorf("a subject (%s) with the subject strategy %q: want the strategy %q", subject, strategy, registry.StrategySubject)
		}
		if version > 0 {
			return fmt.Errorf("version %d with the subject strategy %q: a version is for one subject (strategy %q)", version, strategy, registry.StrategySubject)
		}
	case registry.StrategySubject:
		if subject == "" {
			return fmt.Errorf("the subject strategy %q needs a subject", registry.StrategySubject)
		}
	default:
		return fmt.Errorf("subject strategy %q: want %s, %s or %s", strategy, registry.StrategyType, registry.StrategyTopicType, registry.StrategySubject)
	}
	if version < Latest {
		return fmt.Errorf("version %d: want a version (1 or more) or latest", version)
	}
	return nil
}

// ParseVersion reads a subject's version: "latest" (or empty), or a
// number from 1.
func ParseVersion(s string) (int, error) {
	if s == "" || s == "latest" {
		return Latest, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("version %q: want latest or a version number (1 or more)", s)
	}
	return n, nil
}

// Subject is the subject of an event of type typ to topic; an error
// (ErrNotRegistered) if the strategy needs a type and the event has none,
// or one that cannot name a subject (typeSubject: ".", "..", a control
// character, more than MaxSubjectBytes).
func (s *Encoder) Subject(topic, typ string) (string, error) {
	switch s.cfg.Strategy {
	case registry.StrategySubject:
		return s.cfg.Subject, nil
	case registry.StrategyTopicType:
		if typ == "" {
			return "", fmt.Errorf("%w: the event has no type, which names its subject (<topic>-<type>)", registry.ErrNotRegistered)
		}
		return topic + "-" + typ, registry.TypeSubject(registry.ErrNotRegistered, topic+"-"+typ, typ)
	}
	if typ == "" {
		return "", fmt.Errorf("%w: the event has no type, which names its subject", registry.ErrNotRegistered)
	}
	return typ, registry.TypeSubject(registry.ErrNotRegistered, typ, typ)
}

// Value writes payload, a JSON document, the value of an event of type
// typ to topic, in its subject's schema, framed in Confluent's wire
// format. A NULL payload is a tombstone (nil). maxBytes bounds the value
// (the largest record the sink can publish; 0 none): a larger one is
// ErrTooLarge, found as it is written (registered_avro stops writing
// once past it: a record's defaults can make a value many times its
// payload). Errors: ErrMismatch (a *MismatchError), ErrTooLarge,
// ErrNotRegistered (no such subject or version, or a schema of another
// kind), ErrUnauthorized, or an outage.
func (s *Encoder) Value(ctx context.Context, topic, typ string, payload []byte, maxBytes int) ([]byte, error) {
	if payload == nil {
		return nil, nil
	}
	subject, err := s.Subject(topic, typ)
	if err != nil {
		return nil, err
	}
	c, err := s.schema(ctx, subject, false)
	if err != nil {
		return nil, err
	}
	if n, over := jsonTokens(payload, MaxPayloadTokens); over {
		return nil, fmt.Errorf("%w: the payload holds more than %d JSON values, keys and members (%d bytes read), more than a schema-first format converts", format.ErrTooLarge, MaxPayloadTokens, n)
	}
	out, err := c.write(registry.Frame(make([]byte, 0, 16+min(len(payload), max(maxBytes, 64))), c.id, nil), payload, maxBytes)
	var merr *MismatchError
	if errors.As(err, &merr) && s.cfg.Version == Latest {
		// A new version may have been registered since (an application
		// registers it, then writes payloads of it at once): read the
		// latest again before the payload is called a mismatch, once
		// every MismatchReadInterval at most. A registry that does not
		// answer now holds the event (an outage), as one that does not
		// answer at the first read does: nothing is dead-lettered on a
		// schema that may be out of date.
		cur, again, failed := s.mayReadAgain(subject, c)
		if failed != nil {
			return nil, fmt.Errorf("subject %s: the payload does not fit version %d, and the registry's latest could not be read again (at most once every %s) to know whether a newer one fits it: %w", subject, c.version, s.cfg.MismatchReadInterval, failed)
		}
		if !again && cur.id != c.id {
			// Read again meanwhile (by a concurrent mismatch): a newer
			// version known, which the payload may fit.
			out, err = cur.write(registry.Frame(make([]byte, 0, 16+min(len(payload), max(maxBytes, 64))), cur.id, nil), payload, maxBytes)
		}
		if again {
			c2, rerr := s.read(ctx, subject)
			switch {
			case rerr == nil:
				if c2.id != c.id {
					out, err = c2.write(registry.Frame(make([]byte, 0, 16+min(len(payload), max(maxBytes, 64))), c2.id, nil), payload, maxBytes)
				}
			case registry.Outage(rerr):
				s.readAgainFailed(subject, rerr)
				return nil, fmt.Errorf("subject %s: the payload does not fit version %d, and the registry's latest cannot be read again to know whether a newer one fits it: %w", subject, c.version, rerr)
			case errors.Is(rerr, registry.ErrUnauthorized):
				s.readAgainFailed(subject, rerr)
				return nil, rerr
			}
		}
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Check reads subject's configured version and compiles it: what `walrelay
// check` reports (its id and version), or why it cannot be used.
func (s *Encoder) Check(ctx context.Context, subject string) (id uint32, version int, err error) {
	c, err := s.schema(ctx, subject, true)
	if err != nil {
		return 0, 0, err
	}
	return c.id, c.version, nil
}

// Strategy returns the subject strategy and, for StrategySubject, its
// subject.
func (s *Encoder) Strategy() (strategy, subject string) { return s.cfg.Strategy, s.cfg.Subject }

// registers says what the schema-first formats register, for the error
// of a subject the registry lacks.
func (s *Encoder) registers() string {
	if s.reg.AutoRegister() {
		return "kafka.schema_registry.auto_register is on, and a schema-first format registers only the schema files of kafka.schema_registry.subjects, at start: register the event's schema, or name its file there"
	}
	return "kafka.schema_registry.auto_register is off: walrelay registers nothing; register the event's schema"
}

// Registry is the schema-first encoder's schema registry.
func (s *Encoder) Registry() *registry.Client { return s.reg }
