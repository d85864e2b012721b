package format

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/lru"
)

// ErrUnframed is a value that the application framed itself
// (Passthrough) not in Confluent's wire format (no magic byte 0, or
// shorter than its 5 bytes): the event goes to the dead-letter topic, as
// one of an id the registry lacks (registry.ErrSchemaUnknown) does.
var ErrUnframed = errors.New("the payload is not in Confluent's wire format (the magic byte 0 and a 4-byte schema id)")

// Subject strategies of Passthrough besides the schema-first ones
// (StrategyType, StrategyTopicType, StrategySubject).
const (
	// StrategyTopic: the subject is <topic>-value, Confluent's
	// TopicNameStrategy (its serializers' default); Passthrough's default.
	StrategyTopic = "topic"
	// StrategyAny: any subject; the id only has to exist (an application
	// framing with schemas of several subjects it does not name by topic
	// or type).
	StrategyAny = "any"
)

// PassthroughConfig says which subject a framed value's schema id must
// be a version of.
type PassthroughConfig struct {
	// Strategy is StrategyTopic (the default: <topic>-value),
	// StrategyType (the event's type), StrategyTopicType
	// (<topic>-<type>), StrategySubject (Subject) or StrategyAny (the id
	// only has to exist).
	Strategy string
	// Subject is the subject of StrategySubject.
	Subject string
	// UnusableReadInterval bounds the asking for a schema id the registry
	// lacks: once it answers so, the values framing the id within the
	// interval are ErrSchemaUnknown without a request, so that values of
	// ids the application made up cost a request once per id every
	// UnusableReadInterval, not once each. Default 10 seconds
	// (DefaultUnusableReadInterval).
	UnusableReadInterval time.Duration
}

// CheckPassthroughStrategy checks a Passthrough subject strategy with its
// subject.
func CheckPassthroughStrategy(strategy, subject string) error {
	switch strategy {
	case "", StrategyTopic, registry.StrategyType, registry.StrategyTopicType, StrategyAny:
		if subject != "" {
			return fmt.Errorf("a subject (%s) with the subject strategy %q: want the strategy %q", subject, strategy, registry.StrategySubject)
		}
	case registry.StrategySubject:
		if subject == "" {
			return fmt.Errorf("the subject strategy %q needs a subject", registry.StrategySubject)
		}
	default:
		return fmt.Errorf("subject strategy %q: want %s, %s, %s, %s or %s", strategy, StrategyTopic, registry.StrategyType, registry.StrategyTopicType, registry.StrategySubject, StrategyAny)
	}
	return nil
}

// Passthrough checks values that the application already encoded and
// framed in Confluent's wire format (Debezium's documented recipe: a bytea
// payload that the application serialized with its registry's serializer,
// passed through by the ByteArrayConverter): the framing, that the
// registry has a schema of the framed id, and that this schema is a
// version of the value's subject (PassthroughConfig). The values are left
// untouched. Known ids are cached with their subject: a registry that
// goes away affects only pairs not seen since the start. It is safe for
// concurrent use.
type Passthrough struct {
	reg *registry.Client
	cfg PassthroughConfig
	mu  sync.Mutex
	// known holds the pairs found, at most maxCachedIDs, the least
	// recently used (knownUsed) dropped first.
	known     map[knownID]struct{}
	knownUsed lru.Order[knownID]
	// unknown holds, for each id the registry answered it lacks, when
	// and its error; at most maxCachedIDs, the least recently used
	// (unknownUsed) dropped first.
	unknown     map[uint32]registry.Refusal
	unknownUsed lru.Order[uint32]
	// foreign holds, for each pair whose id the registry has but not in
	// the subject, when and its error; bounded as unknown.
	foreign     map[knownID]registry.Refusal
	foreignUsed lru.Order[knownID]
	// now is the clock of UnusableReadInterval (time.Now; a test's own).
	now func() time.Time
}

// knownID is a schema id found a version of subject ("" under
// StrategyAny: found at all).
type knownID struct {
	id      uint32
	subject string
}

// NewPassthrough returns a checker that looks the ids up in reg, under
// the subject strategy of cfg (StrategyTopic if empty); an error if the
// strategy is not one of Passthrough's.
func NewPassthrough(reg *registry.Client, cfg PassthroughConfig) (*Passthrough, error) {
	if cfg.Strategy == "" {
		cfg.Strategy = StrategyTopic
	}
	if err := CheckPassthroughStrategy(cfg.Strategy, cfg.Subject); err != nil {
		return nil, err
	}
	if cfg.UnusableReadInterval <= 0 {
		cfg.UnusableReadInterval = registry.DefaultUnusableReadInterval
	}
	return &Passthrough{reg: reg, cfg: cfg, known: map[knownID]struct{}{}, unknown: map[uint32]registry.Refusal{},
		foreign: map[knownID]registry.Refusal{}, now: time.Now}, nil
}

// Subject is the subject that the schema of a value of an event of type
// typ to topic must be a version of: "" under StrategyAny; an error
// (ErrSchemaUnknown) if the strategy needs a type and the event has none,
// or one that cannot name a subject (".", "..", a control character, more
// than MaxSubjectBytes).
func (p *Passthrough) Subject(topic, typ string) (string, error) {
	switch p.cfg.Strategy {
	case StrategyAny:
		return "", nil
	case registry.StrategySubject:
		return p.cfg.Subject, nil
	case registry.StrategyType, registry.StrategyTopicType:
		if typ == "" {
			return "", fmt.Errorf("%w: the event has no type, which names the subject of its schema (subject strategy %s)", registry.ErrSchemaUnknown, p.cfg.Strategy)
		}
		subject := typ
		if p.cfg.Strategy == registry.StrategyTopicType {
			subject = topic + "-" + typ
		}
		return subject, registry.TypeSubject(registry.ErrSchemaUnknown, subject, typ)
	}
	return topic + "-value", nil
}

// Check reports whether v, the value of an event of type typ to topic,
// may be published as it is: a nil value (a tombstone) may; else
// ErrUnframed, ErrSchemaUnknown (no schema of the id, or none in the
// value's subject), ErrUnauthorized, or another error of the registry (an
// outage: retry).
func (p *Passthrough) Check(ctx context.Context, topic, typ string, v []byte) error {
	if v == nil {
		return nil
	}
	id, _, err := registry.Unframe(v)
	if err != nil {
		return fmt.Errorf("%w (%d bytes, first %s)", ErrUnframed, len(v), first(v))
	}
	subject, err := p.Subject(topic, typ)
	if err != nil {
		return fmt.Errorf("schema id %d: %w", id, err)
	}
	k := knownID{id: id, subject: subject}
	p.mu.Lock()
	_, ok := p.known[k]
	if ok {
		p.knownUsed.Touch(k)
	}
	u, unknown := p.unknown[id]
	if unknown && u.Fresh(p.now(), p.cfg.UnusableReadInterval) {
		p.unknownUsed.Touch(id)
	} else {
		unknown = false
	}
	if f, ok := p.foreign[k]; !unknown && ok && f.Fresh(p.now(), p.cfg.UnusableReadInterval) {
		p.foreignUsed.Touch(k)
		u, unknown = f, true
	}
	p.mu.Unlock()
	if ok {
		return nil
	}
	if unknown {
		return u.Err
	}
	if _, err := p.reg.SchemaByID(ctx, id); err != nil {
		if errors.Is(err, registry.ErrSchemaUnknown) && ctx.Err() == nil {
			p.mu.Lock()
			lru.MakeRoom(&p.unknownUsed, p.unknown, registry.MaxCachedIDs)
			p.unknown[id] = registry.Refusal{At: p.now(), Err: err}
			p.unknownUsed.Touch(id)
			p.mu.Unlock()
		}
		return err
	}
	if subject != "" {
		// Remembered as an unknown id is: a subject that takes the id
		// meanwhile (its schema registered there too) is found once
		// UnusableReadInterval has passed.
		if err := p.reg.InSubject(ctx, id, subject); err != nil {
			if errors.Is(err, registry.ErrSchemaUnknown) && ctx.Err() == nil {
				p.mu.Lock()
				lru.MakeRoom(&p.foreignUsed, p.foreign, registry.MaxCachedIDs)
				p.foreign[k] = registry.Refusal{At: p.now(), Err: err}
				p.foreignUsed.Touch(k)
				p.mu.Unlock()
			}
			return err
		}
	}
	p.mu.Lock()
	delete(p.unknown, id)
	p.unknownUsed.Remove(id)
	delete(p.foreign, k)
	p.foreignUsed.Remove(k)
	lru.MakeRoom(&p.knownUsed, p.known, registry.MaxCachedIDs)
	p.known[k] = struct{}{}
	p.knownUsed.Touch(k)
	p.mu.Unlock()
	return nil
}

// first names v's first byte, for an error.
func first(v []byte) string {
	if len(v) == 0 {
		return "none"
	}
	return fmt.Sprintf("0x%02x", v[0])
}

// Registry is the checker's schema registry.
func (p *Passthrough) Registry() *registry.Client { return p.reg }
