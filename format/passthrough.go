package format

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/twmb/franz-go/pkg/sr"
)

// Errors of a value that the application framed itself (Passthrough): the
// event goes to the dead-letter topic.
var (
	// ErrUnframed is a value not in Confluent's wire format (no magic byte
	// 0, or shorter than its 5 bytes).
	ErrUnframed = errors.New("the payload is not in Confluent's wire format (the magic byte 0 and a 4-byte schema id)")
	// ErrSchemaUnknown is a framed value whose schema id the registry does
	// not have.
	ErrSchemaUnknown = errors.New("the registry has no schema of the payload's id")
)

// Passthrough checks values that the application already encoded and
// framed in Confluent's wire format (Debezium's documented recipe: a bytea
// payload that the application serialized with its registry's serializer,
// passed through by the ByteArrayConverter): the framing, and that the
// registry has a schema of the framed id. The values are left untouched.
// Known ids are cached: a registry that goes away affects only ids not
// seen since the start. It is safe for concurrent use.
type Passthrough struct {
	reg   *Registry
	mu    sync.Mutex
	known map[uint32]struct{}
}

// NewPassthrough returns a checker that looks the ids up in reg.
func NewPassthrough(reg *Registry) *Passthrough {
	return &Passthrough{reg: reg, known: map[uint32]struct{}{}}
}

// Check reports whether v, a record's value, may be published as it is: a
// nil value (a tombstone) may; else ErrUnframed, ErrSchemaUnknown,
// ErrUnauthorized, or another error of the registry (an outage: retry).
func (p *Passthrough) Check(ctx context.Context, v []byte) error {
	if v == nil {
		return nil
	}
	id, _, err := Unframe(v)
	if err != nil {
		return fmt.Errorf("%w (%d bytes, first %s)", ErrUnframed, len(v), first(v))
	}
	p.mu.Lock()
	_, ok := p.known[id]
	p.mu.Unlock()
	if ok {
		return nil
	}
	if _, err := p.reg.SchemaByID(ctx, id); err != nil {
		return err
	}
	p.mu.Lock()
	if len(p.known) >= maxCachedIDs {
		clear(p.known)
	}
	p.known[id] = struct{}{}
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

// SchemaByID returns the schema of id: ErrSchemaUnknown if the registry
// has none, ErrUnauthorized if it refuses walrelay's credentials, another
// error if it does not answer.
func (r *Registry) SchemaByID(ctx context.Context, id uint32) (sr.Schema, error) {
	s, err := r.cl.SchemaByID(ctx, int(id))
	if err == nil {
		return s, nil
	}
	err = bounded{err}
	var re *sr.ResponseError
	if errors.As(err, &re) {
		switch {
		case notFound(re):
			return sr.Schema{}, fmt.Errorf("schema id %d: %w: %v", id, ErrSchemaUnknown, err)
		case re.StatusCode == http.StatusNotFound:
			return sr.Schema{}, wrongPath(fmt.Sprintf("schema id %d", id), re)
		case re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden:
			return sr.Schema{}, fmt.Errorf("schema id %d: %w (HTTP %d): %v", id, ErrUnauthorized, re.StatusCode, err)
		}
	}
	return sr.Schema{}, fmt.Errorf("schema registry, schema id %d: %w", id, err)
}
