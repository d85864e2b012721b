package schemafirst

import (
	"context"
	"errors"
	"fmt"
	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/sr"

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

// ErrMismatch is a payload that does not fit its schema (a missing
// required field, a field the schema does not have, a value of another
// type): the event goes to the dead-letter topic. Its error is a
// *MismatchError.
var ErrMismatch = errors.New("the payload does not fit its schema")

// MismatchError is a payload that does not fit the schema of its subject:
// Field is where (a JSON pointer, "/order/qty"; "" for the whole payload),
// Reason what.
type MismatchError struct {
	Subject string
	Version int
	Field   string
	Reason  string
}

func (e *MismatchError) Error() string {
	field := e.Field
	if field == "" {
		field = "/"
	}
	return fmt.Sprintf("subject %s version %d: field %s: %s", e.Subject, e.Version, field, e.Reason)
}

// Is makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

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

type subjectVersion struct {
	subject string
	version int
}

// unusableRead is a reading that found a schema unusable (or an id
// unknown): when, and its error.
type unusableRead struct {
	at  time.Time
	err error
}

// subjectReads is what a subject's last readings were, guarded by
// Encoder.mu.
type subjectReads struct {
	// mismatchRead is when a mismatch last made walrelay read the
	// subject's latest again, and mismatchReadErr why that reading
	// failed (an outage or ErrUnauthorized; nil if it did not).
	mismatchRead    time.Time
	mismatchReadErr error
	// unusable is the last reading that found the subject's schema
	// unusable (ErrNotRegistered); its zero value if the last reading
	// found it usable.
	unusable unusableRead
}

// maxSubjectReads bounds the subjects whose last readings a Encoder
// remembers (MismatchReadInterval, UnusableReadInterval): some hundreds
// of bytes each. Past it, the least recently used is forgotten: a writer
// cycling through more subjects than this within an interval may cost a
// reading of each again within it.
const maxSubjectReads = 10000

// compiledSchema is one version of a subject, ready to write payloads.
type compiledSchema struct {
	id      uint32
	version int
	learnt  time.Time
	size    int // CompiledSize
	// write appends payload in the schema to dst; a value of more than
	// maxBytes (0: no bound) with dst is ErrTooLarge, else an error is a
	// *MismatchError.
	write func(dst, payload []byte, maxBytes int) ([]byte, error)
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

// mayReadAgain reports whether a payload that does not fit c, subject's
// latest known, may read the latest again now: not if a mismatch did
// within MismatchReadInterval. If so it claims the reading (concurrent
// mismatches do not read too); if not, failed is why that reading failed
// (nil if it did not: the payload is a mismatch, unless it fits cur).
// cur is the latest known now: c, or a version read meanwhile.
func (s *Encoder) mayReadAgain(subject string, c *compiledSchema) (cur *compiledSchema, again bool, failed error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := subjectVersion{subject, s.cfg.Version}
	cur = c
	if known, ok := s.schemas[k]; ok {
		cur = known
	}
	r := s.readsOf(k)
	now := s.now()
	if !r.mismatchRead.IsZero() && now.Sub(r.mismatchRead) < s.cfg.MismatchReadInterval {
		return cur, false, r.mismatchReadErr
	}
	r.mismatchRead, r.mismatchReadErr = now, nil
	return cur, true, nil
}

// readAgainFailed records why the reading again that mayReadAgain
// allowed failed: mismatches until the interval passes are held with it.
func (s *Encoder) readAgainFailed(subject string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readsOf(subjectVersion{subject, s.cfg.Version}).mismatchReadErr = err
}

// MaxPayloadTokens bounds the JSON that a schema-first format converts:
// its objects, arrays, members and array items (its '{', '[', ':' and
// ',' outside strings). Converting costs memory by the value, whatever
// its bytes: some 60 bytes of heap a token for the parsed JSON of
// registered_avro, 100 for registered_jsonschema's validation, 200 for
// registered_protobuf's dynamic messages (2.9 MiB of "{}," in an array,
// within postgres.max_message_bytes: 1,000,000 empty messages, a peak of
// 333 MiB). A payload of more is ErrTooLarge (dead-lettered too_large)
// before it is parsed: at the bound a payload costs a peak of some 8 to
// 25 MiB. Outbox events hold tens to thousands.
const MaxPayloadTokens = 1 << 17

// jsonTokens counts payload's tokens as MaxPayloadTokens does, stopping
// past most: over is whether there are more than most, n the bytes read.
func jsonTokens(payload []byte, most int) (n int, over bool) {
	tokens := 0
	in := false
	for i := 0; i < len(payload); i++ {
		c := payload[i]
		if in {
			switch c {
			case '\\':
				i++
			case '"':
				in = false
			}
			continue
		}
		switch c {
		case '"':
			in = true
		case '{', '[', ':', ',':
			if tokens++; tokens > most {
				return i + 1, true
			}
		}
	}
	return len(payload), false
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

// schema returns subject's compiled schema of the configured version,
// from the cache unless refresh (or a latest too old).
func (s *Encoder) schema(ctx context.Context, subject string, refresh bool) (*compiledSchema, error) {
	k := subjectVersion{subject, s.cfg.Version}
	s.mu.Lock()
	c, ok := s.schemas[k]
	if ok {
		s.schemasUsed.Touch(k)
	}
	s.mu.Unlock()
	if ok && !refresh && (s.cfg.Version != Latest || s.now().Sub(c.learnt) < s.cfg.LatestTTL) {
		return c, nil
	}
	if !refresh {
		if err := s.unusableWithin(k); err != nil {
			return nil, err
		}
	}
	fresh, err := s.read(ctx, subject)
	if err != nil && ok && registry.Outage(err) {
		// A registry that does not answer the reading again of a
		// latest: the one known serves meanwhile (for payloads that fit
		// it; Value reads again before calling one a mismatch).
		return c, nil
	}
	return fresh, err
}

// read reads subject's configured version from the registry, compiles it
// and caches it. Errors: ErrNotRegistered (worded by whether walrelay
// registers schemas), ErrUnauthorized, or an outage.
func (s *Encoder) read(ctx context.Context, subject string) (*compiledSchema, error) {
	c, err := s.readCompile(ctx, subject)
	k := subjectVersion{subject, s.cfg.Version}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err == nil:
		// A failure is forgotten, the registry having answered.
		r := s.readsOf(k)
		r.unusable, r.mismatchReadErr = unusableRead{}, nil
	case errors.Is(err, registry.ErrNotRegistered) && ctx.Err() == nil:
		s.readsOf(k).unusable = unusableRead{at: s.now(), err: err}
	}
	return c, err
}

// readsOf is k's subjectReads, made the most recently used (added if
// there are none); s.mu is held.
func (s *Encoder) readsOf(k subjectVersion) *subjectReads {
	r, ok := s.reads[k]
	if !ok {
		lru.MakeRoom(&s.readsUsed, s.reads, maxSubjectReads)
		r = &subjectReads{}
		s.reads[k] = r
	}
	s.readsUsed.Touch(k)
	return r
}

// unusableWithin is the error of the reading of k that found its schema
// unusable within UnusableReadInterval; nil if none did.
func (s *Encoder) unusableWithin(k subjectVersion) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reads[k]
	if !ok || r.unusable.err == nil || s.now().Sub(r.unusable.at) >= s.cfg.UnusableReadInterval {
		return nil
	}
	s.readsUsed.Touch(k)
	return r.unusable.err
}

// readCompile is read without the memory of unusable subjects.
func (s *Encoder) readCompile(ctx context.Context, subject string) (*compiledSchema, error) {
	ss, err := s.reg.Client().SchemaByVersion(ctx, subject, s.cfg.Version)
	if err != nil {
		err = registry.Classify(subject, err)
		if errors.Is(err, registry.ErrNotRegistered) {
			err = fmt.Errorf("%w (%s)", err, s.registers())
		}
		return nil, err
	}
	refs, err := s.reg.References(ctx, ss.Schema.Schema, ss.Schema.References)
	if err != nil {
		// A referenced subject the registry lacks is ErrNotRegistered;
		// a registry that does not answer for it, an outage (held).
		return nil, fmt.Errorf("subject %s version %d: %w", subject, ss.Version, err)
	}
	c, err := s.compile(ctx, ss, refs)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("subject %s version %d: %w", subject, ss.Version, ctx.Err())
		}
		return nil, fmt.Errorf("subject %s version %d: %w: %w", subject, ss.Version, registry.ErrNotRegistered, err)
	}
	c.size = registry.CompiledSize(ss.Schema.Schema, refs)
	k := subjectVersion{subject, s.cfg.Version}
	s.mu.Lock()
	if old, ok := s.schemas[k]; ok {
		s.size -= old.size
		delete(s.schemas, k)
		s.schemasUsed.Remove(k)
	}
	// Full: the least recently used go, one at a time (the bounds on
	// reading again are kept apart, in reads).
	for len(s.schemas) >= maxCachedSchemas || s.size+c.size > format.MaxCachedSchemaBytes {
		old, ok := s.schemasUsed.Oldest()
		if !ok {
			break
		}
		s.size -= s.schemas[old].size
		delete(s.schemas, old)
		s.schemasUsed.Remove(old)
	}
	s.schemas[k] = c
	s.size += c.size
	s.schemasUsed.Touch(k)
	s.mu.Unlock()
	return c, nil
}

// registers says what the schema-first formats register, for the error
// of a subject the registry lacks.
func (s *Encoder) registers() string {
	if s.reg.AutoRegister() {
		return "kafka.schema_registry.auto_register is on, and a schema-first format registers only the schema files of kafka.schema_registry.subjects, at start: register the event's schema, or name its file there"
	}
	return "kafka.schema_registry.auto_register is off: walrelay registers nothing; register the event's schema"
}

// compile makes a registered schema ready to write payloads, with the
// schemas it references (refs, as References gives them).
func (s *Encoder) compile(ctx context.Context, ss sr.SubjectSchema, refs []registry.Reference) (*compiledSchema, error) {
	kind := ss.Type.String() // AVRO when the API leaves schemaType out

	if kind != s.cfg.Kind {
		return nil, fmt.Errorf("a %s schema, and the format writes %s", kind, s.cfg.Kind)
	}
	if ss.ID < 0 || ss.ID > 1<<32-1 {
		return nil, fmt.Errorf("the id %d, which Confluent's framing cannot carry", ss.ID)
	}
	c := &compiledSchema{id: uint32(ss.ID), version: ss.Version, learnt: s.now()}
	mismatch := func(field, reason string) *MismatchError {
		return &MismatchError{Subject: ss.Subject, Version: ss.Version, Field: clip(field), Reason: clip(reason)}
	}
	var err error
	switch s.cfg.Kind {
	case KindAvro:
		c.write, err = compileAvro(ss.Schema.Schema, refs, mismatch)
	case KindProtobuf:
		var w func(dst, payload []byte) ([]byte, *MismatchError)
		w, err = compileProtobuf(ctx, ss.Schema.Schema, registry.RefsByName(refs), s.cfg.Message, mismatch)
		c.write = capped(w)
	case KindJSONSchema:
		var w func(dst, payload []byte) ([]byte, *MismatchError)
		w, err = compileJSONSchema(ss.Schema.Schema, registry.RefsByName(refs), mismatch)
		c.write = capped(w)
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// capped bounds the values of w, a writer whose value is about its
// payload's size (Protobuf's binary encoding of protojson's JSON, JSON
// Schema's JSON as it is): measured once written.
func capped(w func(dst, payload []byte) ([]byte, *MismatchError)) func(dst, payload []byte, maxBytes int) ([]byte, error) {
	if w == nil {
		return nil
	}
	return func(dst, payload []byte, maxBytes int) ([]byte, error) {
		out, merr := w(dst, payload)
		if merr != nil {
			return nil, merr
		}
		if maxBytes > 0 && len(out) > maxBytes {
			return nil, fmt.Errorf("%w: %d bytes, more than the %d of a record to the topic", format.ErrTooLarge, len(out), maxBytes)
		}
		return out, nil
	}
}

// maxCachedSchemas bounds the parsed schemas kept, in number.
const maxCachedSchemas = 1000

// maxReason bounds a mismatch's field and reason: they go into the log and
// the dead letter's error header, and may quote the payload's values.
const maxReason = 300

// clip cuts s to maxReason bytes, on a character boundary.
func clip(s string) string {
	if len(s) <= maxReason {
		return s
	}
	cut := maxReason
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// Registry is the schema-first encoder's schema registry.
func (s *Encoder) Registry() *registry.Client { return s.reg }
