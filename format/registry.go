package format

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/internal/lru"
	"github.com/walrelay/walrelay/internal/noredirect"
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

// MaxSubjectBytes bounds a subject that walrelay makes of an event's type
// (the type and topic_type strategies): Apicurio keeps a subject (an
// artifact id) in 512 characters, and a request whose path is kilobytes
// long gets no answer from it at all.
const MaxSubjectBytes = 512

// typeSubject checks subject, made of the event's type typ (the
// application's data), before any request names it: a subject that no
// registry can have, or that changes the request's path (".", "..", which
// a server normalizes away: "/subjects/../versions/latest" is
// "/versions/latest", a 404 without Confluent's error code, read as a
// wrong URL, which would hold the whole stream for ever on one event), is
// the event's error, wrapping kind (ErrNotRegistered, ErrSchemaUnknown)
// and naming the type.
func typeSubject(kind error, subject, typ string) error {
	why := ""
	switch {
	case subject == "":
		why = "an empty subject"
	case subject == "." || subject == "..":
		why = "a path segment that the request's URL loses"
	case len(subject) > MaxSubjectBytes:
		why = fmt.Sprintf("a subject of %d bytes, more than the %d a registry keeps", len(subject), MaxSubjectBytes)
	case !utf8.ValidString(subject):
		why = "not UTF-8"
	case strings.IndexFunc(subject, unicode.IsControl) >= 0:
		why = "a control character, which a registry refuses in a subject"
	default:
		return nil
	}
	return fmt.Errorf("%w: the event's type %q (%d bytes) cannot name a subject: %s", kind, clip(typ), len(typ), why)
}

// Errors of a registry that retrying cannot fix for that schema: the event
// goes to the dead-letter topic. ErrUnauthorized stops walrelay. Any other
// error of the registry (down, slow, 5xx) is an outage: the event is held
// and sent again.
var (
	// ErrNotRegistered is a schema, a subject or a version that the
	// registry says it does not have (HTTP 404 with Confluent's error code
	// 40401, 40402 or 40403), where walrelay registers nothing: with
	// auto-registration off, or a schema-first format (which registers
	// only the operator's schema files, at start).
	ErrNotRegistered = errors.New("the schema is not registered under its subject")
	// ErrRefused is a schema that the registry refuses (incompatible with
	// the subject's, or invalid).
	ErrRefused = errors.New("the registry refused the schema")
	// ErrUnauthorized is a registry refusing walrelay's credentials (401)
	// or the subject to them (403): the whole stream's error, which the
	// operator fixes.
	ErrUnauthorized = errors.New("the schema registry refused walrelay's credentials")
	// ErrNotSchemaRegistry is a URL that answers, but not as Confluent's
	// Schema Registry API does: a 404 without Confluent's error code (a
	// wrong path: Apicurio serves the API at /apis/ccompat/v7, its own v2
	// API is another), or an answer that is not the API's JSON. It is a
	// configuration problem, held as an outage (the events wait, nothing
	// is dead-lettered); walrelay run refuses to start on it (Ping).
	ErrNotSchemaRegistry = errors.New("the schema registry URL does not serve Confluent's Schema Registry API (a wrong path? Apicurio serves it at /apis/ccompat/v7)")
)

// retryLater reports whether an HTTP status asks the client to retry
// later: 408 Request Timeout, 425 Too Early, 429 Too Many Requests
// (Confluent's and Apicurio's rate limit, error code 42901). Such an
// answer is an outage (held, retried), never a refusal of the schema nor
// a URL that does not serve the API.
func retryLater(status int) bool {
	return status == http.StatusRequestTimeout || status == http.StatusTooEarly || status == http.StatusTooManyRequests
}

// notFound reports whether re is Confluent's API saying that it does not
// have a subject (error code 40401), a version (40402) or a schema
// (40403): a 404 without one of these codes is a path the server does not
// serve (ErrNotSchemaRegistry), not an answer about the schema.
func notFound(re *sr.ResponseError) bool {
	return re.StatusCode == http.StatusNotFound && re.ErrorCode >= 40401 && re.ErrorCode <= 40403
}

// wrongPath is the error of a 404 that is not Confluent's notFound.
func wrongPath(what string, re *sr.ResponseError) error {
	return fmt.Errorf("%s: %w: HTTP 404 from %s without Confluent's error code (error_code %d: %s)", what, ErrNotSchemaRegistry, redacted(re.URL), re.ErrorCode, clip(re.Error()))
}

// redacted is u without a password, should the URL carry one.
func redacted(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Redacted()
	}
	return "the registry's URL"
}

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
	// MaxSchemaBytes bounds the text of a schema that ID registers or
	// looks up (one inferred from a payload): a larger one is the
	// payload's error (ErrPayload), not sent. Default 1 MiB, Confluent's
	// own bound (its schemas are records of a Kafka topic, 1 MB each by
	// default).
	MaxSchemaBytes int
	// MaxAnswerBytes bounds one answer of the registry: a larger one is an
	// error (an outage: held) instead of memory. Default 16 MiB.
	MaxAnswerBytes int64
	// MaxCompiledSchemaBytes bounds the text of a registry's schema that
	// is parsed or compiled (a schema-first format's, the inbox's), with
	// the text of every schema it references: a larger one is
	// ErrNotRegistered (walrelay dead-letters its events schema_refused,
	// the inbox its records undecodable), not compiled. Compiling costs
	// some 40 to 80 times the text at its peak (a 512 KiB schema 25 to 42
	// MiB: hamba/avro, protocompile, jsonschema), and keeping it some 10
	// to 16 times. Default 512 KiB (DefaultMaxCompiledSchemaBytes), far
	// above Debezium's schemas of wide tables (some 100 bytes a column).
	MaxCompiledSchemaBytes int
	// UnusableReadInterval bounds the asking about a schema the registry
	// refused for a payload (ID: not registered with AutoRegister off, or
	// incompatible): the same schema of the same subject is asked about
	// again at most once every UnusableReadInterval, its payloads in
	// between given the same error without a request, so that a writer's
	// rows of a refused shape cost a request once per interval, not once
	// each. Default 10 seconds (DefaultUnusableReadInterval). A schema
	// registered meanwhile is used once the interval has passed.
	UnusableReadInterval time.Duration
}

// Defaults of RegistryConfig.
const (
	DefaultMaxSchemaBytes         = 1 << 20
	DefaultMaxAnswerBytes         = 16 << 20
	DefaultMaxCompiledSchemaBytes = 512 << 10
)

// MaxReferences bounds the distinct schemas that a schema references,
// directly or through its references (a Protobuf file's imports, an Avro
// schema's named types from other subjects): each is one request and
// stays in memory. Debezium and Confluent's serializers reference a
// handful.
const MaxReferences = 100

// Registry is a client of a schema registry that caches the id of each
// schema of each subject it has learnt (a schema is registered or looked
// up once per process).
type Registry struct {
	cl        *sr.Client
	auto      bool
	maxSchema int
	// maxCompiled is RegistryConfig.MaxCompiledSchemaBytes.
	maxCompiled int
	obs         *observed // reports each request (OnRequest)
	mu          sync.Mutex
	ids         map[subjectSchema]uint32
	idsUsed     lru.Order[subjectSchema]
	// refused holds the schemas the registry refused (ErrRefused,
	// ErrNotRegistered), with when and why, at most maxCachedIDs, the
	// least recently used dropped first: asked again once
	// unusableInterval has passed, not once a row.
	refused          map[subjectSchema]unusableRead
	refusedUsed      lru.Order[subjectSchema]
	unusableInterval time.Duration
	// now is the clock of unusableInterval (time.Now; a test's own).
	now func() time.Time
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
	if err := CheckRegistryURL(cfg.URL); err != nil {
		return nil, fmt.Errorf("schema registry URL: %w", err)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.MaxSchemaBytes <= 0 {
		cfg.MaxSchemaBytes = DefaultMaxSchemaBytes
	}
	if cfg.MaxAnswerBytes <= 0 {
		cfg.MaxAnswerBytes = DefaultMaxAnswerBytes
	}
	if cfg.MaxCompiledSchemaBytes <= 0 {
		cfg.MaxCompiledSchemaBytes = DefaultMaxCompiledSchemaBytes
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.TLS != nil {
		tr.TLSClientConfig = cfg.TLS
	}
	// No redirect is followed (noredirect): Go's client would send the
	// basic auth along to another port of the host or from https to http,
	// and take another server's answer as the registry's.
	obs := &observed{base: noredirect.Transport(tr), max: cfg.MaxAnswerBytes}
	opts := []sr.ClientOpt{sr.URLs(cfg.URL), sr.HTTPClient(noredirect.Client(obs, cfg.Timeout)), sr.UserAgent("walrelay")}
	if cfg.Username != "" {
		opts = append(opts, sr.BasicAuth(cfg.Username, cfg.Password))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("schema registry client: %w", err)
	}
	if cfg.UnusableReadInterval <= 0 {
		cfg.UnusableReadInterval = DefaultUnusableReadInterval
	}
	return &Registry{cl: cl, auto: cfg.AutoRegister, maxSchema: cfg.MaxSchemaBytes, maxCompiled: cfg.MaxCompiledSchemaBytes, obs: obs,
		ids: map[subjectSchema]uint32{}, refused: map[subjectSchema]unusableRead{}, unusableInterval: cfg.UnusableReadInterval, now: time.Now}, nil
}

// Errors of CheckRegistryURL.
var (
	// ErrRegistryURL is a registry URL that is not http or https with a
	// host.
	ErrRegistryURL = errors.New("want an http or https URL with a host (http://host:port/path)")
	// ErrRegistryURLCredentials is a registry URL with credentials in it
	// (user@ or user:password@): franz-go's errors print the URL.
	ErrRegistryURLCredentials = errors.New("the URL holds credentials (user@ or user:password@), which errors would print: give them as the username and password instead")
	// ErrRegistryURLQuery is a registry URL with a query or a fragment
	// (?access_token=..., #...): franz-go keeps the query on every
	// request and its errors print the URL whole, so a token there would
	// be printed; walrelay's registry API takes none.
	ErrRegistryURLQuery = errors.New("the URL has a query or fragment (?... or #...), which errors would print and the registry's API does not take: give credentials as the username and password, or a TLS client certificate")
)

// CheckRegistryURL refuses a schema registry URL that is not http or
// https with a host (ErrRegistryURL), that holds credentials
// (ErrRegistryURLCredentials), or that has a query or fragment, where a
// token would be (ErrRegistryURLQuery). A token in the path cannot be told
// from a path and passes. The error never prints the URL: a URL
// without its scheme ("user:pw@registry:8081") parses as the scheme
// "user", and franz-go, putting http:// in front of it, would print the
// password in every error.
func CheckRegistryURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		if err == nil && u.User != nil {
			return ErrRegistryURLCredentials
		}
		return ErrRegistryURL
	}
	if u.User != nil {
		return ErrRegistryURLCredentials
	}
	// Any '?' or '#' left after the authority starts a query or fragment,
	// even an empty one ("http://registry/?"); none is part of a path.
	if strings.ContainsAny(raw, "?#") {
		return ErrRegistryURLQuery
	}
	return nil
}

// ID returns the id of an Avro schema under subject, registering it the
// first time if auto-registration is on, looking it up otherwise.
func (r *Registry) ID(ctx context.Context, subject, schema string) (uint32, error) {
	k := subjectSchema{subject, sha256.Sum256([]byte(schema))}
	r.mu.Lock()
	id, ok := r.ids[k]
	if ok {
		r.idsUsed.Touch(k)
	}
	refused, wasRefused := r.refused[k]
	if wasRefused {
		r.refusedUsed.Touch(k)
	}
	r.mu.Unlock()
	if ok {
		return id, nil
	}
	if wasRefused && r.now().Sub(refused.at) < r.unusableInterval {
		return 0, refused.err
	}
	if len(schema) > r.maxSchema {
		return 0, fmt.Errorf("subject %s: %w: its schema is %d bytes, more than the %d that walrelay sends to a registry (Confluent's keeps a schema in one Kafka record)", subject, ErrPayload, len(schema), r.maxSchema)
	}
	s := sr.Schema{Schema: schema, Type: sr.TypeAvro}
	var n int
	var err error
	if r.auto {
		if n, err = r.register(ctx, subject, s); err != nil {
			err = classify(subject, err)
		}
	} else {
		var ss sr.SubjectSchema
		ss, err = r.cl.LookupSchema(ctx, subject, s)
		n = ss.ID
		if err != nil {
			err = classify(subject, err)
			if errors.Is(err, ErrNotRegistered) {
				err = fmt.Errorf("%w (kafka.schema_registry.auto_register is off: walrelay looks schemas up and registers none; register it, or turn auto_register on)", err)
			}
		}
	}
	if err != nil {
		if (errors.Is(err, ErrRefused) || errors.Is(err, ErrNotRegistered)) && ctx.Err() == nil {
			r.mu.Lock()
			lru.MakeRoom(&r.refusedUsed, r.refused, maxCachedIDs)
			r.refused[k] = unusableRead{at: r.now(), err: err}
			r.refusedUsed.Touch(k)
			r.mu.Unlock()
		}
		return 0, err
	}
	if n < 0 || n > 1<<32-1 {
		return 0, fmt.Errorf("subject %s: the registry gave the id %d, which Confluent's framing cannot carry", subject, n)
	}
	r.mu.Lock()
	delete(r.refused, k)
	r.refusedUsed.Remove(k)
	// Many distinct payload shapes: the one used longest ago goes.
	lru.MakeRoom(&r.idsUsed, r.ids, maxCachedIDs)
	r.ids[k] = uint32(n)
	r.idsUsed.Touch(k)
	r.mu.Unlock()
	return uint32(n), nil
}

// register registers s under subject and returns its id. Several clients
// registering the first schema of a subject at once (walrelays side by
// side, or beside Debezium) may have the registry answer the losers 409
// (Apicurio: the subject "already exists"), as it answers a schema that
// the subject's compatibility rule refuses: on 409 the schema is looked
// up (registered meanwhile by another) and registered once again before
// it is called refused. The error is the registry's, for the caller to
// classify.
func (r *Registry) register(ctx context.Context, subject string, s sr.Schema) (int, error) {
	n, err := r.cl.RegisterSchema(ctx, subject, s, -1, -1)
	for try := 0; err != nil && conflict(err) && try < 2; try++ {
		var ss sr.SubjectSchema
		if ss, err = r.cl.LookupSchema(ctx, subject, s); err == nil {
			return ss.ID, nil
		}
		var re *sr.ResponseError
		if !errors.As(err, &re) || !notFound(re) {
			break // an outage, or credentials refused: as classify says
		}
		n, err = r.cl.RegisterSchema(ctx, subject, s, -1, -1)
	}
	return n, err
}

// conflict reports whether err is a registry's 409.
func conflict(err error) bool {
	var re *sr.ResponseError
	return errors.As(err, &re) && re.StatusCode == http.StatusConflict
}

// maxCachedIDs bounds the cache of ids (a schema is a payload's shape:
// payloads of many shapes make many); each entry is a subject, a hash and
// an id, some 100 bytes.
const maxCachedIDs = 10000

// classify tells a registry's refusal of one schema (a deterministic
// error for that value) from an outage (transient).
func classify(subject string, err error) error {
	err = registryError(err)
	var re *sr.ResponseError
	if errors.As(err, &re) {
		switch {
		case notFound(re):
			return fmt.Errorf("subject %s: %w: %v", subject, ErrNotRegistered, err)
		case re.StatusCode == http.StatusNotFound:
			return wrongPath("subject "+subject, re)
		case re.StatusCode == http.StatusConflict || re.StatusCode == http.StatusUnprocessableEntity || re.StatusCode == http.StatusRequestEntityTooLarge:
			return fmt.Errorf("subject %s: %w: %v", subject, ErrRefused, err)
		case re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden:
			return fmt.Errorf("subject %s: %w (HTTP %d): %v", subject, ErrUnauthorized, re.StatusCode, err)
		}
	}
	return fmt.Errorf("schema registry, subject %s: %w", subject, err)
}

// maxErrorText bounds the text of a registry's error in walrelay's
// errors: an error's text is the answer's body when it is not the API's
// JSON (a proxy's HTML page, up to the answers' bound), and it goes into
// the log at each retry and into a dead letter's walrelay.error header.
const maxErrorText = 1000

// bounded is an error whose text is cut to maxErrorText bytes; errors.Is
// and errors.As see the error it wraps.
type bounded struct{ err error }

func (b bounded) Error() string {
	s := b.err.Error()
	if len(s) <= maxErrorText {
		return s
	}
	cut := maxErrorText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… (%d bytes)", len(s))
}

func (b bounded) Unwrap() error { return b.err }

// Reference is a schema that a schema references: the name it is
// referenced by (an import path, a $ref, an Avro type's full name) and its
// text.
type Reference struct{ Name, Text string }

// References reads the schemas that the schema text references (an
// imported .proto, a $ref'd JSON Schema, an Avro schema's named types),
// and theirs: each subject and version once, after those it references
// itself (the order Avro's parser needs: a named type before its use), at
// most 10 deep. The schema and its references are bounded together
// before anything is compiled: at most MaxReferences references, and at
// most RegistryConfig.MaxCompiledSchemaBytes of text with the schema's
// own (checked as each is fetched: no more is fetched past the bound).
// Errors: ErrNotRegistered (a subject or version the registry lacks,
// references nested too deep, too many or too large), ErrUnauthorized, or
// an outage.
func (r *Registry) References(ctx context.Context, text string, refs []sr.SchemaReference) ([]Reference, error) {
	size := len(text)
	if size > r.maxCompiled {
		return nil, schemaTooLarge(fmt.Sprintf("the schema is %d bytes, more than the %d bytes of a schema compiled with its references", size, r.maxCompiled))
	}
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
			if len(seen) >= MaxReferences {
				return schemaTooLarge(fmt.Sprintf("the schema references more than %d schemas", MaxReferences))
			}
			seen[k] = true
			ss, err := r.cl.SchemaByVersion(ctx, ref.Subject, ref.Version)
			if err != nil {
				return fmt.Errorf("reference %s (subject %s version %d): %w", ref.Name, ref.Subject, ref.Version, classify(ref.Subject, err))
			}
			if size += len(ss.Schema.Schema); size > r.maxCompiled {
				return schemaTooLarge(fmt.Sprintf("the schema with its references is more than the %d bytes of a schema compiled with its references", r.maxCompiled))
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

// ErrSchemaTooLarge is a registry's schema that is not compiled: with its
// references, more than RegistryConfig.MaxCompiledSchemaBytes of text, or
// more than MaxReferences references. It is ErrNotRegistered too (a
// schema that cannot be used: walrelay dead-letters the event
// schema_refused, the inbox the record undecodable).
var ErrSchemaTooLarge = errors.New("the schema is too large to compile")

// schemaTooLargeError is an ErrSchemaTooLarge (and ErrNotRegistered).
type schemaTooLargeError struct{ why string }

func (e *schemaTooLargeError) Error() string { return e.why }
func (e *schemaTooLargeError) Is(target error) bool {
	return target == ErrSchemaTooLarge || target == ErrNotRegistered
}

// schemaTooLarge is an ErrSchemaTooLarge saying why.
func schemaTooLarge(why string) error { return &schemaTooLargeError{why} }

// CompiledSize is the bytes of a schema's text and its references'
// (what a cache of compiled schemas counts them by).
func CompiledSize(text string, refs []Reference) int {
	n := len(text)
	for _, r := range refs {
		n += len(r.Name) + len(r.Text)
	}
	return n
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

// Ping asks the registry for its subjects: an error if it does not answer
// or asks to retry later (408, 425, 429: an outage, Outage is true),
// refuses the credentials (ErrUnauthorized),
// or answers something else than Confluent's API (ErrNotSchemaRegistry:
// a wrong path, another API, a web page, a redirect).
func (r *Registry) Ping(ctx context.Context) error {
	_, err := r.cl.Subjects(ctx)
	if err == nil {
		return nil
	}
	err = registryError(err)
	var re *sr.ResponseError
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, ErrNotSchemaRegistry):
	case errors.As(err, &re) && (re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden):
		err = fmt.Errorf("%w (HTTP %d): %v", ErrUnauthorized, re.StatusCode, err)
	case errors.As(err, &re) && re.StatusCode == http.StatusNotFound:
		err = wrongPath("GET /subjects", re)
	case errors.As(err, &re) && retryLater(re.StatusCode):
		// Confluent's API (or a proxy in front of it) asking to retry: an
		// outage, not a wrong URL.
	case errors.As(err, &re) && re.StatusCode < 500:
		err = fmt.Errorf("%w: HTTP %d to GET /subjects from %s: %s", ErrNotSchemaRegistry, re.StatusCode, redacted(re.URL), clip(re.Error()))
	case errors.As(err, &syntax), errors.As(err, &typ):
		err = fmt.Errorf("%w: its answer to GET /subjects is not the API's JSON: %v", ErrNotSchemaRegistry, err)
	}
	return fmt.Errorf("schema registry: %w", err)
}
