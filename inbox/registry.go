package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/format/schemafirst"
	"github.com/walrelay/walrelay/internal/lru"
)

// The schema types that a Registry decodes (Decoded.Type), as the
// registry names them.
const (
	// Avro is Avro (walrelay's avro, registry_passthrough and
	// registered_avro formats).
	Avro = schemafirst.KindAvro
	// Protobuf is Protobuf after Confluent's message indexes
	// (registered_protobuf).
	Protobuf = schemafirst.KindProtobuf
	// JSONSchema is JSON, its schema a JSON Schema (registered_jsonschema).
	JSONSchema = schemafirst.KindJSONSchema
)

// SchemaID is the schema id of the message's value if it is in
// Confluent's wire format (a registry format of walrelay's): ok is false
// for a value in another format, or a tombstone.
func (m Message) SchemaID() (id uint32, ok bool) {
	id, _, err := registry.Unframe(m.Value)
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

// Decoded decodes the message's value, in Confluent's wire format, with
// Config.Registry: its schema id, type and value (Registry.Decoded); an
// error without a Registry in the Config.
func (m Message) Decoded(ctx context.Context) (Decoded, error) {
	if m.reg == nil {
		return Decoded{}, errors.New("inbox: Message.Decoded needs Config.Registry")
	}
	return m.reg.Decoded(ctx, m.Value)
}

// Registry decodes keys and values in Confluent's wire format with the
// schemas of a schema registry: Avro, Protobuf (after Confluent's message
// indexes) and JSON Schema. Each schema is fetched once by its id (with
// its references), compiled and kept (the 10,000 used last, within
// format.MaxCachedSchemaBytes); an id found unusable is fetched again at
// most once every RegistryConfig.UnusableReadInterval. It is safe for
// concurrent use; one Registry serves every handler.
type Registry struct {
	reg      *registry.Client
	validate bool
	maxSize  int // RegistryConfig.MaxDecodedBytes
	mu       sync.Mutex
	// schemas are the schemas cached; when full (maxSchemas,
	// format.MaxCachedSchemaBytes), the least recently used
	// (schemasUsed) is dropped, one at a time.
	schemas     map[uint32]*schema
	schemasUsed lru.Order[uint32]
	// size is the schemas' registry.CompiledSize in all: at most
	// format.MaxCachedSchemaBytes.
	size int
	// compiling is held while a schema is compiled: one at a time, so
	// that partitions meeting new schemas together do not each hold a
	// compilation's peak.
	compiling sync.Mutex
	// unusable holds, for each schema id that a fetch found unusable,
	// when and why (ErrUndecodable); at most maxSchemas of them, the
	// least recently used (unusableUsed) dropped first.
	unusable     map[uint32]registry.Refusal
	unusableUsed lru.Order[uint32]
	interval     time.Duration // RegistryConfig.UnusableReadInterval
	// now is the clock of UnusableReadInterval (time.Now; a test's own).
	now func() time.Time
}

// NewRegistry returns a decoder of the registry of cfg. A URL that is not
// http or https with a host is refused (a host:port with credentials and
// no scheme, "user:pw@registry:8081", would be read as the scheme "user"),
// and so is one with credentials in it (http://user:password@host,
// http://token@host) or a query or fragment (?access_token=...): they go
// in Username and Password or TLS (a URL is printed in errors and logs, a
// password never is).
func NewRegistry(cfg RegistryConfig) (*Registry, error) {
	// The errors never print the URL: it may hold a password or a token.
	switch err := registry.CheckURL(cfg.URL); {
	case errors.Is(err, registry.ErrURLCredentials):
		return nil, errors.New("inbox: RegistryConfig.URL holds credentials (user@ or user:password@): give them in RegistryConfig.Username and RegistryConfig.Password")
	case errors.Is(err, registry.ErrURLQuery):
		return nil, errors.New("inbox: RegistryConfig.URL has a query or fragment (?... or #...), which errors and logs would print: give credentials in RegistryConfig.Username and RegistryConfig.Password, or a client certificate in RegistryConfig.TLS")
	case err != nil:
		return nil, errors.New("inbox: RegistryConfig.URL is not a URL of the registry: want http or https with a host (http://host:port/path; a host:port needs its http://)")
	}
	if cfg.MaxSchemaBytes <= 0 {
		cfg.MaxSchemaBytes = registry.DefaultMaxCompiledSchemaBytes
	}
	reg, err := registry.New(registry.Config{URL: cfg.URL, Username: cfg.Username, Password: cfg.Password, Timeout: cfg.Timeout, TLS: cfg.TLS,
		MaxCompiledSchemaBytes: cfg.MaxSchemaBytes, MaxAnswerBytes: 8 * int64(cfg.MaxSchemaBytes)})
	if err != nil {
		return nil, err
	}
	if cfg.MaxDecodedBytes < 0 {
		return nil, errors.New("inbox: RegistryConfig.MaxDecodedBytes is negative")
	}
	if cfg.MaxDecodedBytes == 0 {
		cfg.MaxDecodedBytes = format.MaxDecodedBytes
	}
	if cfg.UnusableReadInterval <= 0 {
		cfg.UnusableReadInterval = DefaultUnusableReadInterval
	}
	return &Registry{reg: reg, validate: cfg.ValidateJSON, maxSize: cfg.MaxDecodedBytes, schemas: map[uint32]*schema{},
		unusable: map[uint32]registry.Refusal{}, interval: cfg.UnusableReadInterval, now: time.Now}, nil
}

// Decoded is a key or value in Confluent's wire format, decoded.
type Decoded struct {
	// ID is the schema id of its framing.
	ID uint32
	// Type is its schema's type: Avro, Protobuf or JSONSchema.
	Type string
	// Message is the full name of the Protobuf message that its message
	// indexes name ("shop.OrderCreated"); "" for the other types.
	Message string
	// Value is the decoded value:
	//   - Avro: plain Go values, as Registry.Decode into *any gives them;
	//   - Protobuf: a proto.Message, a *dynamicpb.Message of the schema's
	//     message (protojson.Marshal writes it in JSON, Decoded.JSON
	//     too);
	//   - JSON Schema: the JSON as encoding/json's Unmarshal into an any
	//     gives it (an object a map[string]any, numbers float64).
	Value any
	// Body is the encoded value after the framing (and, for Protobuf, the
	// message indexes): an Avro datum, a Protobuf message, a JSON text.
	Body []byte
}

// JSON is the value in JSON: the text itself for JSON Schema, protojson's
// for Protobuf (proto3's JSON mapping: fields by their JSON name, 64-bit
// integers as strings), encoding/json's of the plain values for Avro.
func (d Decoded) JSON() ([]byte, error) {
	switch v := d.Value.(type) {
	case proto.Message:
		var js []byte
		err := noPanic(v.ProtoReflect().Descriptor().FullName(), func() (err error) {
			js, err = protojson.Marshal(v)
			return err
		})
		return js, err
	default:
		if d.Type == JSONSchema {
			return d.Body, nil
		}
		return json.Marshal(v)
	}
}

// Decoded decodes b, a key or value in Confluent's wire format (m.Value,
// m.Key), with the schema its id names: its id, type and value. Errors as
// Decode's.
func (r *Registry) Decoded(ctx context.Context, b []byte) (Decoded, error) {
	id, s, body, err := r.unframe(ctx, b)
	if err != nil {
		return Decoded{}, err
	}
	d := Decoded{ID: id, Type: s.typ, Body: body}
	switch s.typ {
	case Avro:
		if d.Value, err = format.DecodeAvroWithin(s.codecs(), s.avro, body, r.maxSize); err != nil {
			return Decoded{}, undecodable(id, err)
		}
	case Protobuf:
		md, msg, err := r.message(id, s, body)
		if err != nil {
			return Decoded{}, err
		}
		m := dynamicpb.NewMessage(md)
		if err := proto.Unmarshal(msg, m); err != nil {
			return Decoded{}, undecodable(id, fmt.Errorf("decode the Protobuf message %s: %w", md.FullName(), err))
		}
		d.Message, d.Value, d.Body = string(md.FullName()), m, msg
	case JSONSchema:
		if err := json.Unmarshal(body, &d.Value); err != nil {
			return Decoded{}, undecodable(id, fmt.Errorf("decode the JSON: %w", err))
		}
	}
	return d, nil
}

// Decode decodes b, a key or value in Confluent's wire format (m.Value,
// m.Key), with the schema its id names, into v, a pointer:
//
// Avro:
//   - *any or *map[string]any: plain Go values (a record a
//     map[string]any by field name, an array []any, a union its branch's
//     value, nil for null; int32 as int, int64, float64, string, bool,
//     []byte), as the JSON payload's would be after encoding/json's
//     Unmarshal, numbers aside;
//   - anything else: hamba/avro's Unmarshal (a struct with `avro:"name"`
//     field tags, say).
//
// Protobuf (the message that the indexes name):
//   - a proto.Message (a generated *pb.OrderCreated, say; or a pointer
//     to a nil one, which is allocated): proto.Unmarshal into it; its
//     message must be the one the indexes name (the same full name);
//   - anything else (a struct with `json` tags, *any, *map[string]any):
//     the message in JSON as protojson writes it (Decoded.JSON), read by
//     encoding/json's Unmarshal.
//
// JSON Schema (validated first with RegistryConfig.ValidateJSON):
//   - a proto.Message: protojson's Unmarshal;
//   - anything else: encoding/json's Unmarshal.
//
// A v that is not a non-nil pointer is the handler's error, not the
// value's: an error that is not ErrUndecodable.
//
// Errors: ErrUndecodable (ErrNotFramed for b not framed, an error
// wrapping registry.ErrSchemaUnknown for an id the registry lacks, any
// failure to compile the schema or to decode b with it into v), on which
// the consumer dead-letters the record at once; ErrRegistryUnavailable (a
// registry that did not answer for a schema not cached yet), on which it
// retries the record without limit, not counting it as an attempt.
func (r *Registry) Decode(ctx context.Context, b []byte, v any) error {
	if rv := reflect.ValueOf(v); rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("inbox: decode into %T: want a non-nil pointer", v)
	}
	id, s, body, err := r.unframe(ctx, b)
	if err != nil {
		return err
	}
	switch s.typ {
	case Avro:
		return decodeAvro(id, s, body, v, r.maxSize)
	case Protobuf:
		md, msg, err := r.message(id, s, body)
		if err != nil {
			return err
		}
		if pm, ok := protoTarget(v); ok {
			if got := pm.ProtoReflect().Descriptor().FullName(); got != md.FullName() {
				return undecodable(id, fmt.Errorf("the value is a %s: cannot decode it into a %s (%T)", md.FullName(), got, v))
			}
			if err := proto.Unmarshal(msg, pm); err != nil {
				return undecodable(id, fmt.Errorf("decode the Protobuf message %s: %w", md.FullName(), err))
			}
			return nil
		}
		m := dynamicpb.NewMessage(md)
		if err := proto.Unmarshal(msg, m); err != nil {
			return undecodable(id, fmt.Errorf("decode the Protobuf message %s: %w", md.FullName(), err))
		}
		var js []byte
		err = noPanic(md.FullName(), func() (err error) {
			js, err = protojson.Marshal(m)
			return err
		})
		if err != nil {
			return undecodable(id, fmt.Errorf("the Protobuf message %s in JSON: %w", md.FullName(), err))
		}
		if err := json.Unmarshal(js, v); err != nil {
			return undecodable(id, fmt.Errorf("decode the Protobuf message %s, in JSON, into %T: %w", md.FullName(), v, err))
		}
		return nil
	default: // JSONSchema
		if pm, ok := protoTarget(v); ok {
			if err := noPanic(pm.ProtoReflect().Descriptor().FullName(), func() error { return protojson.Unmarshal(body, pm) }); err != nil {
				return undecodable(id, fmt.Errorf("decode the JSON into %T: %w", v, err))
			}
			return nil
		}
		if err := json.Unmarshal(body, v); err != nil {
			return undecodable(id, fmt.Errorf("decode the JSON into %T: %w", v, err))
		}
		return nil
	}
}

// noPanic runs f, a call of protojson on a message of name, and turns a
// panic of it into an error blaming the schema: protojson assumes that a
// message named as one of Google's well-known types has Google's fields,
// and panics on one that has not (schemafirst.CompileProtobuf refuses such a
// schema; this is the defence behind it). A panic in a handler has the
// record retried as the handler's failure; the schema's fault is the
// record's: undecodable.
func noPanic(name protoreflect.FullName, f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("protobuf (Go's) panicked on the message %s (%v): its schema is at fault (a well-known type's name with other fields?)", name, p)
		}
	}()
	return f()
}

// decodeAvro decodes body, an Avro datum of s, into v, its decoded cost
// bounded by format.DecodedBudget(len(body), maxSize).
func decodeAvro(id uint32, s *schema, body []byte, v any, maxSize int) error {
	switch p := v.(type) {
	case *any:
		x, err := format.DecodeAvroWithin(s.codecs(), s.avro, body, maxSize)
		if err != nil {
			return undecodable(id, err)
		}
		*p = x
	case *map[string]any:
		x, err := format.DecodeAvroWithin(s.codecs(), s.avro, body, maxSize)
		if err != nil {
			return undecodable(id, err)
		}
		mp, ok := x.(map[string]any)
		if !ok {
			return undecodable(id, fmt.Errorf("a %s, not a record", s.avro.Type()))
		}
		*p = mp
	default:
		if err := format.UnmarshalAvroWithin(s.codecs(), s.avro, body, v, maxSize); err != nil {
			return undecodable(id, fmt.Errorf("into %T: %w", v, err))
		}
	}
	return nil
}

var protoMessageType = reflect.TypeFor[proto.Message]()

// protoTarget is v as a proto.Message to decode into: v itself, or the
// message that v, a pointer to a message pointer, points to (allocated
// if nil).
func protoTarget(v any) (proto.Message, bool) {
	if pm, ok := v.(proto.Message); ok {
		return pm, true
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Pointer || !rv.Elem().Type().Implements(protoMessageType) {
		return nil, false
	}
	if rv.Elem().IsNil() {
		rv.Elem().Set(reflect.New(rv.Elem().Type().Elem()))
	}
	pm, ok := rv.Elem().Interface().(proto.Message)
	return pm, ok
}

// unframe splits b into its schema id and body, and returns the compiled
// schema of the id (a JSON Schema one is fetched only to be validated
// against).
func (r *Registry) unframe(ctx context.Context, b []byte) (uint32, *schema, []byte, error) {
	id, body, err := registry.Unframe(b)
	if err != nil {
		if len(b) == 0 {
			return 0, nil, nil, undecodable(0, fmt.Errorf("%w (empty: a tombstone?)", ErrNotFramed))
		}
		return 0, nil, nil, undecodable(0, fmt.Errorf("%w (%d bytes, first 0x%02x)", ErrNotFramed, len(b), b[0]))
	}
	s, err := r.schema(ctx, id)
	if err != nil {
		return 0, nil, nil, err
	}
	if s.json != nil {
		if field, reason, ok := s.json.Check(body); !ok {
			if field == "" {
				field = "/"
			}
			return 0, nil, nil, undecodable(id, fmt.Errorf("the JSON is not valid in its schema: field %s: %s", field, reason))
		}
	}
	return id, s, body, nil
}

// message is the Protobuf message descriptor that the indexes at the
// start of body name in s, and the message's bytes after them, checked
// to decode within RegistryConfig.MaxDecodedBytes (schemafirst.CheckProtobuf).
func (r *Registry) message(id uint32, s *schema, body []byte) (protoreflect.MessageDescriptor, []byte, error) {
	indexes, msg, err := schemafirst.SplitMessageIndexes(body)
	if err != nil {
		return nil, nil, undecodable(id, err)
	}
	md, err := schemafirst.MessageByIndexes(s.proto, indexes)
	if err != nil {
		return nil, nil, undecodable(id, err)
	}
	if err := schemafirst.CheckProtobuf(md, msg, r.maxSize); err != nil {
		return nil, nil, undecodable(id, err)
	}
	return md, msg, nil
}
