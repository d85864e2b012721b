package schemafirst

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/lru"
)

// The compiled schemas of an Encoder, by subject and version: read from
// the registry once, kept within maxCachedSchemas and
// format.MaxCachedSchemaBytes (the least recently used dropped first),
// read again after LatestTTL or a mismatch, and a reading that found a
// schema unusable remembered for UnusableReadInterval.

type subjectVersion struct {
	subject string
	version int
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
	unusable registry.Refusal
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
		r.unusable, r.mismatchReadErr = registry.Refusal{}, nil
	case errors.Is(err, registry.ErrNotRegistered) && ctx.Err() == nil:
		s.readsOf(k).unusable = registry.Refusal{At: s.now(), Err: err}
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
	if !ok || !r.unusable.Fresh(s.now(), s.cfg.UnusableReadInterval) {
		return nil
	}
	s.readsUsed.Touch(k)
	return r.unusable.Err
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
	lru.Drop(&s.schemasUsed, s.schemas, func() bool {
		return len(s.schemas) >= maxCachedSchemas || s.size+c.size > format.MaxCachedSchemaBytes
	}, func(old *compiledSchema) { s.size -= old.size })
	s.schemas[k] = c
	s.size += c.size
	s.schemasUsed.Touch(k)
	s.mu.Unlock()
	return c, nil
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

// maxCachedSchemas bounds the parsed schemas kept, in number.
const maxCachedSchemas = 1000
