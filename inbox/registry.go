package inbox

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/format"
)

// ErrNotFramed is a key or value that is not in Confluent's wire format
// (the magic byte 0 and a 4-byte schema id): not written by a schema
// registry format.
var ErrNotFramed = format.ErrUnframed

// SchemaID is the schema id of the message's value if it is in
// Confluent's wire format (kafka.value_format avro, or
// registry_passthrough): ok is false for a value in another format, or a
// tombstone.
func (m Message) SchemaID() (id uint32, ok bool) {
	id, _, err := format.Unframe(m.Value)
	return id, err == nil
}

// Decode decodes the message's value, in Confluent's wire format, into v
// with Config.Registry (Registry.Decode says into what); an error without
// a Registry in the Config.
func (m Message) Decode(ctx context.Context, v any) error {
	if m.reg == nil {
		return errors.New("inbox: Message.Decode needs Config.Registry")
	}
	return m.reg.Decode(ctx, m.Value, v)
}

// RegistryConfig is how a consumer reaches the schema registry of the
// records it decodes (Confluent's Schema Registry API; Apicurio serves it
// at /apis/ccompat/v7).
type RegistryConfig struct {
	// URL is the registry's base URL.
	URL string
	// Username and Password are for HTTP basic auth; none when Username is
	// empty.
	Username, Password string
	// Timeout bounds one request; default 10 s.
	Timeout time.Duration
	// TLS is the TLS configuration of an https URL; nil for Go's defaults.
	TLS *tls.Config
}

// Registry decodes keys and values in Confluent's wire format with the
// schemas of a schema registry, each schema fetched once by its id and
// kept. It is safe for concurrent use; one Registry serves every handler.
type Registry struct {
	reg     *format.Registry
	mu      sync.Mutex
	schemas map[uint32]avro.Schema
}

// NewRegistry returns a decoder of the registry of cfg.
func NewRegistry(cfg RegistryConfig) (*Registry, error) {
	reg, err := format.NewRegistry(format.RegistryConfig{URL: cfg.URL, Username: cfg.Username, Password: cfg.Password, Timeout: cfg.Timeout, TLS: cfg.TLS})
	if err != nil {
		return nil, err
	}
	return &Registry{reg: reg, schemas: map[uint32]avro.Schema{}}, nil
}

// maxSchemas bounds the schemas kept.
const maxSchemas = 10000

// Decode decodes b, a key or value in Confluent's wire format (m.Value,
// m.Key), into v, a pointer:
//   - *any or *map[string]any: plain Go values (a record a
//     map[string]any by field name, an array []any, a union its branch's
//     value, nil for null; int32 as int, int64, float64, string, bool,
//     []byte), as the JSON payload's would be after encoding/json's
//     Unmarshal, numbers aside;
//   - anything else: hamba/avro's Unmarshal (a struct with `avro:"name"`
//     field tags, say).
//
// ErrNotFramed for b not framed; an error wrapping format.ErrSchemaUnknown
// if the registry has no schema of its id; an error if the schema is not
// Avro, or b does not decode with it. A handler returning such an error
// has the record retried, then dead-lettered (Config.MaxAttempts).
func (r *Registry) Decode(ctx context.Context, b []byte, v any) error {
	id, body, err := format.Unframe(b)
	if err != nil {
		return ErrNotFramed
	}
	s, err := r.schema(ctx, id)
	if err != nil {
		return err
	}
	switch p := v.(type) {
	case *any:
		x, err := format.DecodeAvroWith(s, body)
		if err != nil {
			return fmt.Errorf("schema id %d: %w", id, err)
		}
		*p = x
	case *map[string]any:
		x, err := format.DecodeAvroWith(s, body)
		if err != nil {
			return fmt.Errorf("schema id %d: %w", id, err)
		}
		mp, ok := x.(map[string]any)
		if !ok {
			return fmt.Errorf("schema id %d: a %s, not a record", id, s.Type())
		}
		*p = mp
	default:
		if err := avro.Unmarshal(s, body, v); err != nil {
			return fmt.Errorf("schema id %d: decode in Avro into %T: %w", id, v, err)
		}
	}
	return nil
}

// schema returns the parsed schema of id, fetched the first time.
func (r *Registry) schema(ctx context.Context, id uint32) (avro.Schema, error) {
	r.mu.Lock()
	s, ok := r.schemas[id]
	r.mu.Unlock()
	if ok {
		return s, nil
	}
	got, err := r.reg.SchemaByID(ctx, id)
	if err != nil {
		return nil, err
	}
	if got.Type != sr.TypeAvro {
		return nil, fmt.Errorf("schema id %d is %s: only Avro is decoded", id, got.Type)
	}
	s, err = avro.ParseWithCache(got.Schema, "", &avro.SchemaCache{})
	if err != nil {
		return nil, fmt.Errorf("schema id %d: parse the Avro schema: %w", id, err)
	}
	r.mu.Lock()
	if len(r.schemas) >= maxSchemas {
		clear(r.schemas)
	}
	r.schemas[id] = s
	r.mu.Unlock()
	return s, nil
}
