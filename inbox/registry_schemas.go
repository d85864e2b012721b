package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/format/schemafirst"
	"github.com/walrelay/walrelay/internal/lru"
)

// schema is a registry's schema, compiled.
type schema struct {
	typ  string
	size int         // registry.CompiledSize
	avro avro.Schema // Avro
	// api is the hamba/avro configuration an Avro schema decodes with
	// (nil: defaultCodecs): its own, since a configuration keeps a
	// decoder per schema (and target type) for as long as it lives, so
	// that the decoders go with the schema dropped from the cache (some
	// 4.5 KB each; hamba/avro's package-wide DefaultConfig would keep
	// every schema's decoder for ever).
	api   avro.API
	proto protoreflect.FileDescriptor // Protobuf
	json  *schemafirst.JSONSchema     // JSON Schema with ValidateJSON
}

// maxSchemas bounds the schemas kept in number (format.MaxCachedSchemaBytes
// bounds them in bytes).
const maxSchemas = 10000

// defaultCodecs is the hamba/avro configuration of a schema outside a
// Registry's cache.
var defaultCodecs = format.AvroDecodeConfig()

// codecs is the hamba/avro configuration that s decodes with.
func (s *schema) codecs() avro.API {
	if s.api == nil {
		return defaultCodecs
	}
	return s.api
}

// schema returns the compiled schema of id, fetched (with its references)
// and compiled the first time; an id found unusable within
// UnusableReadInterval is its error again, without a request.
func (r *Registry) schema(ctx context.Context, id uint32) (*schema, error) {
	r.mu.Lock()
	s, ok := r.schemas[id]
	if ok {
		r.schemasUsed.Touch(id)
	}
	u, failed := r.unusable[id]
	if failed && u.Fresh(r.now(), r.interval) {
		r.unusableUsed.Touch(id)
	} else {
		failed = false
	}
	r.mu.Unlock()
	if ok {
		return s, nil
	}
	if failed {
		return nil, u.Err
	}
	s, err := r.fetch(ctx, id)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil:
		delete(r.unusable, id)
		r.unusableUsed.Remove(id)
	case errors.Is(err, ErrUndecodable) && ctx.Err() == nil:
		lru.MakeRoom(&r.unusableUsed, r.unusable, maxSchemas)
		r.unusable[id] = registry.Refusal{At: r.now(), Err: err}
		r.unusableUsed.Touch(id)
	}
	return s, err
}

// fetch fetches the schema of id (with its references), compiles it and
// caches it.
func (r *Registry) fetch(ctx context.Context, id uint32) (*schema, error) {
	got, err := r.reg.SchemaByID(ctx, id)
	if err != nil {
		if errors.Is(err, registry.ErrSchemaUnknown) {
			return nil, undecodable(id, err)
		}
		return nil, registryDown(err)
	}
	s := &schema{typ: got.Type.String()} // AVRO when the API leaves schemaType out
	switch s.typ {
	case Avro, Protobuf, JSONSchema:
		if s.typ == JSONSchema && !r.validate {
			break // decoded as it is: nothing to compile
		}
		refs, err := r.reg.References(ctx, got.Schema, got.References)
		if err != nil {
			if errors.Is(err, registry.ErrNotRegistered) {
				return nil, undecodable(id, err)
			}
			return nil, registryDown(fmt.Errorf("schema id %d: %w", id, err))
		}
		s.size = registry.CompiledSize(got.Schema, refs)
		r.compiling.Lock()
		switch s.typ {
		case Avro:
			s.avro, err = format.ParseAvro(got.Schema, refs)
		case Protobuf:
			s.proto, err = schemafirst.CompileProtobuf(ctx, got.Schema, registry.RefsByName(refs))
		default:
			s.json, err = schemafirst.CompileJSONSchema(got.Schema, registry.RefsByName(refs))
		}
		r.compiling.Unlock()
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("schema id %d: compile: %w", id, ctx.Err())
			}
			return nil, undecodable(id, err)
		}
	default:
		return nil, undecodable(id, fmt.Errorf("a schema of type %s, which is not decoded", s.typ))
	}
	if s.avro != nil {
		s.api = format.AvroDecodeConfig()
	}
	r.mu.Lock()
	if old, ok := r.schemas[id]; ok {
		r.size -= old.size // compiled meanwhile for another record
		delete(r.schemas, id)
		r.schemasUsed.Remove(id)
	}
	// Full: the least recently used go, one at a time.
	lru.Drop(&r.schemasUsed, r.schemas, func() bool {
		return len(r.schemas) >= maxSchemas || r.size+s.size > format.MaxCachedSchemaBytes
	}, func(old *schema) { r.size -= old.size })
	r.schemas[id] = s
	r.size += s.size
	r.schemasUsed.Touch(id)
	r.mu.Unlock()
	return s, nil
}
