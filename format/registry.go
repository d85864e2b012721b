package format

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
)

// Confluent's wire format: a record's key or value is the magic byte 0,
// the schema's id (4 bytes, big-endian), then the encoded value.
const magic = 0

// Frame appends body framed in Confluent's wire format with the schema id.
func Frame(dst []byte, id uint32, body []byte) []byte {
	dst = append(dst, magic)
	dst = binary.BigEndian.AppendUint32(dst, id)
	return append(dst, body...)
}

// Unframe splits a value in Confluent's wire format into its schema id and
// its body.
func Unframe(b []byte) (id uint32, body []byte, err error) {
	if len(b) < 5 || b[0] != magic {
		return 0, nil, errors.New("not in Confluent's wire format (magic byte 0 and a 4-byte schema id)")
	}
	return binary.BigEndian.Uint32(b[1:5]), b[5:], nil
}

// Subject is the subject of a topic's keys or values under the topic name
// strategy (Confluent's TopicNameStrategy, Apicurio's TopicIdStrategy):
// <topic>-key, <topic>-value.
func Subject(topic string, key bool) string {
	if key {
		return topic + "-key"
	}
	return topic + "-value"
}

// Errors of a registry that retrying cannot fix for that schema: the event
// goes to the dead-letter topic. ErrUnauthorized stops walrelay. Any other
// error of the registry (down, slow, 5xx) is an outage: the event is held
// and sent again.
var (
	// ErrNotRegistered is a schema not registered under its subject, with
	// auto-registration off.
	ErrNotRegistered = errors.New("the schema is not registered under its subject (and auto-registration is off)")
	// ErrRefused is a schema that the registry refuses (incompatible with
	// the subject's, or invalid).
	ErrRefused = errors.New("the registry refused the schema")
	// ErrUnauthorized is a registry refusing walrelay's credentials (401)
	// or the subject to them (403): the whole stream's error, which the
	// operator fixes.
	ErrUnauthorized = errors.New("the schema registry refused walrelay's credentials")
)

// RegistryConfig is how walrelay reaches a schema registry through
// Confluent's Schema Registry API (Apicurio serves it at
// /apis/ccompat/v7).
type RegistryConfig struct {
	// URL is the registry's base URL.
	URL string
	// Username and Password are for HTTP basic auth; none when Username is
	// empty. The password is never logged or printed.
	Username, Password string
	// AutoRegister registers a schema not yet registered under its
	// subject; otherwise such a value is dead-lettered (ErrNotRegistered).
	AutoRegister bool
	// Timeout bounds one request to the registry; default 10 s.
	Timeout time.Duration
	// TLS is the TLS configuration of https URLs; nil for Go's defaults.
	TLS *tls.Config
}

// Registry is a client of a schema registry that caches the id of each
// schema of each subject it has learnt (a schema is registered or looked
// up once per process).
type Registry struct {
	cl   *sr.Client
	auto bool
	obs  *observed // reports each request (OnRequest)
	mu   sync.Mutex
	ids  map[subjectSchema]uint32
}

// subjectSchema keys the cache of ids: a subject and its schema's SHA-256
// (not the text itself: the schema of a wide or deep payload is megabytes,
// and the cache holds up to maxCachedIDs of them).
type subjectSchema struct {
	subject string
	schema  [sha256.Size]byte
}

// NewRegistry returns a client of the registry of cfg.
func NewRegistry(cfg RegistryConfig) (*Registry, error) {
	if cfg.URL == "" {
		return nil, errors.New("no schema registry URL")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.TLS != nil {
		tr.TLSClientConfig = cfg.TLS
	}
	obs := &observed{base: tr}
	opts := []sr.ClientOpt{sr.URLs(cfg.URL), sr.HTTPClient(&http.Client{Timeout: cfg.Timeout, Transport: obs}), sr.UserAgent("walrelay")}
	if cfg.Username != "" {
		opts = append(opts, sr.BasicAuth(cfg.Username, cfg.Password))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("schema registry client: %w", err)
	}
	return &Registry{cl: cl, auto: cfg.AutoRegister, obs: obs, ids: map[subjectSchema]uint32{}}, nil
}

// ID returns the id of an Avro schema under subject, registering it the
// first time if auto-registration is on, looking it up otherwise.
func (r *Registry) ID(ctx context.Context, subject, schema string) (uint32, error) {
	k := subjectSchema{subject, sha256.Sum256([]byte(schema))}
	r.mu.Lock()
	id, ok := r.ids[k]
	r.mu.Unlock()
	if ok {
		return id, nil
	}
	s := sr.Schema{Schema: schema, Type: sr.TypeAvro}
	var n int
	var err error
	if r.auto {
		n, err = r.cl.RegisterSchema(ctx, subject, s, -1, -1)
	} else {
		var ss sr.SubjectSchema
		ss, err = r.cl.LookupSchema(ctx, subject, s)
		n = ss.ID
	}
	if err != nil {
		return 0, classify(subject, err)
	}
	if n < 0 || n > 1<<32-1 {
		return 0, fmt.Errorf("subject %s: the registry gave the id %d, which Confluent's framing cannot carry", subject, n)
	}
	r.mu.Lock()
	if len(r.ids) >= maxCachedIDs {
		clear(r.ids) // many distinct payload shapes: learn again
	}
	r.ids[k] = uint32(n)
	r.mu.Unlock()
	return uint32(n), nil
}

// maxCachedIDs bounds the cache of ids (a schema is a payload's shape:
// payloads of many shapes make many); each entry is a subject, a hash and
// an id, some 100 bytes.
const maxCachedIDs = 10000

// classify tells a registry's refusal of one schema (a deterministic
// error for that value) from an outage (transient).
func classify(subject string, err error) error {
	var re *sr.ResponseError
	if errors.As(err, &re) {
		switch {
		case re.StatusCode == http.StatusNotFound:
			return fmt.Errorf("subject %s: %w: %v", subject, ErrNotRegistered, err)
		case re.StatusCode == http.StatusConflict || re.StatusCode == http.StatusUnprocessableEntity:
			return fmt.Errorf("subject %s: %w: %v", subject, ErrRefused, err)
		case re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden:
			return fmt.Errorf("subject %s: %w (HTTP %d): %v", subject, ErrUnauthorized, re.StatusCode, err)
		}
	}
	return fmt.Errorf("schema registry, subject %s: %w", subject, err)
}

// Reference is a schema that a schema references: the name it is
// referenced by (an import path, a $ref, an Avro type's full name) and its
// text.
type Reference struct{ Name, Text string }

// References reads the schemas that a schema references (an imported
// .proto, a $ref'd JSON Schema, an Avro schema's named types), and
// theirs: each subject and version once, after those it references itself
// (the order Avro's parser needs: a named type before its use), at most 10
// deep. Errors: ErrNotRegistered (a subject or version the registry lacks,
// or references nested too deep), ErrUnauthorized, or an outage.
func (r *Registry) References(ctx context.Context, refs []sr.SchemaReference) ([]Reference, error) {
	var out []Reference
	seen := map[subjectVersion]bool{}
	var walk func(refs []sr.SchemaReference, depth int) error
	walk = func(refs []sr.SchemaReference, depth int) error {
		if len(refs) > 0 && depth > 10 {
			return fmt.Errorf("%w: schema references nested more than 10 deep", ErrNotRegistered)
		}
		for _, ref := range refs {
			k := subjectVersion{ref.Subject, ref.Version}
			if seen[k] {
				continue
			}
			seen[k] = true
			ss, err := r.cl.SchemaByVersion(ctx, ref.Subject, ref.Version)
			if err != nil {
				return fmt.Errorf("reference %s (subject %s version %d): %w", ref.Name, ref.Subject, ref.Version, classify(ref.Subject, err))
			}
			if err := walk(ss.Schema.References, depth+1); err != nil {
				return err
			}
			out = append(out, Reference{ref.Name, ss.Schema.Schema})
		}
		return nil
	}
	if err := walk(refs, 0); err != nil {
		return nil, err
	}
	return out, nil
}

// RefsByName maps references by the name they are referenced by, as the
// Protobuf compiler and the JSON Schema validator look them up.
func RefsByName(refs []Reference) map[string]string {
	if len(refs) == 0 {
		return nil
	}
	m := make(map[string]string, len(refs))
	for _, r := range refs {
		m[r.Name] = r.Text
	}
	return m
}

// Client is the registry's client, for reading schemas back.
func (r *Registry) Client() *sr.Client { return r.cl }

// Ping asks the registry for its subjects: an error if it does not answer,
// refuses the credentials, or answers something else than Confluent's API.
func (r *Registry) Ping(ctx context.Context) error {
	if _, err := r.cl.Subjects(ctx); err != nil {
		return fmt.Errorf("schema registry: %w", err)
	}
	return nil
}
