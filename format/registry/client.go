package registry

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/internal/lru"
	"github.com/walrelay/walrelay/internal/noredirect"
)

// Config is how walrelay reaches a schema registry through
// Confluent's Schema Registry API (Apicurio serves it at
// /apis/ccompat/v7).
type Config struct {
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

// Defaults of Config.
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

// Client is a client of a schema registry that caches the id of each
// schema of each subject it has learnt (a schema is registered or looked
// up once per process).
type Client struct {
	cl        *sr.Client
	auto      bool
	maxSchema int
	// maxCompiled is Config.MaxCompiledSchemaBytes.
	maxCompiled int
	obs         *observed // reports each request (OnRequest)
	mu          sync.Mutex
	ids         map[subjectSchema]uint32
	idsUsed     lru.Order[subjectSchema]
	// refused holds the schemas the registry refused (ErrRefused,
	// ErrNotRegistered), with when and why, at most MaxCachedIDs, the
	// least recently used dropped first: asked again once
	// unusableInterval has passed, not once a row.
	refused          map[subjectSchema]Refusal
	refusedUsed      lru.Order[subjectSchema]
	unusableInterval time.Duration
	// now is the clock of unusableInterval (time.Now; a test's own).
	now func() time.Time
}

// subjectSchema keys the cache of ids: a subject and its schema's SHA-256
// (not the text itself: the schema of a wide or deep payload is megabytes,
// and the cache holds up to MaxCachedIDs of them).
type subjectSchema struct {
	subject string
	schema  [sha256.Size]byte
}

// New returns a client of the registry of cfg.
func New(cfg Config) (*Client, error) {
	if cfg.URL == "" {
		return nil, errors.New("no schema registry URL")
	}
	if err := CheckURL(cfg.URL); err != nil {
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
	return &Client{cl: cl, auto: cfg.AutoRegister, maxSchema: cfg.MaxSchemaBytes, maxCompiled: cfg.MaxCompiledSchemaBytes, obs: obs,
		ids: map[subjectSchema]uint32{}, refused: map[subjectSchema]Refusal{}, unusableInterval: cfg.UnusableReadInterval, now: time.Now}, nil
}

// Errors of CheckURL.
var (
	// ErrURL is a registry URL that is not http or https with a
	// host.
	ErrURL = errors.New("want an http or https URL with a host (http://host:port/path)")
	// ErrURLCredentials is a registry URL with credentials in it
	// (user@ or user:password@): franz-go's errors print the URL.
	ErrURLCredentials = errors.New("the URL holds credentials (user@ or user:password@), which errors would print: give them as the username and password instead")
	// ErrURLQuery is a registry URL with a query or a fragment
	// (?access_token=..., #...): franz-go keeps the query on every
	// request and its errors print the URL whole, so a token there would
	// be printed; walrelay's registry API takes none.
	ErrURLQuery = errors.New("the URL has a query or fragment (?... or #...), which errors would print and the registry's API does not take: give credentials as the username and password, or a TLS client certificate")
)

// CheckURL refuses a schema registry URL that is not http or
// https with a host (ErrURL), that holds credentials
// (ErrURLCredentials), or that has a query or fragment, where a
// token would be (ErrURLQuery). A token in the path cannot be told
// from a path and passes. The error never prints the URL: a URL
// without its scheme ("user:pw@registry:8081") parses as the scheme
// "user", and franz-go, putting http:// in front of it, would print the
// password in every error.
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		if err == nil && u.User != nil {
			return ErrURLCredentials
		}
		return ErrURL
	}
	if u.User != nil {
		return ErrURLCredentials
	}
	// Any '?' or '#' left after the authority starts a query or fragment,
	// even an empty one ("http://registry/?"); none is part of a path.
	if strings.ContainsAny(raw, "?#") {
		return ErrURLQuery
	}
	return nil
}

// ID returns the id of an Avro schema under subject, registering it the
// first time if auto-registration is on, looking it up otherwise.
func (r *Client) ID(ctx context.Context, subject, schema string) (uint32, error) {
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
	if wasRefused && refused.Fresh(r.now(), r.unusableInterval) {
		return 0, refused.Err
	}
	if len(schema) > r.maxSchema {
		return 0, fmt.Errorf("subject %s: %w: its schema is %d bytes, more than the %d that walrelay sends to a registry (Confluent's keeps a schema in one Kafka record)", subject, ErrPayload, len(schema), r.maxSchema)
	}
	s := sr.Schema{Schema: schema, Type: sr.TypeAvro}
	var n int
	var err error
	if r.auto {
		if n, err = r.Register(ctx, subject, s); err != nil {
			err = Classify(subject, err)
		}
	} else {
		var ss sr.SubjectSchema
		ss, err = r.cl.LookupSchema(ctx, subject, s)
		n = ss.ID
		if err != nil {
			err = Classify(subject, err)
			if errors.Is(err, ErrNotRegistered) {
				err = fmt.Errorf("%w (kafka.schema_registry.auto_register is off: walrelay looks schemas up and registers none; register it, or turn auto_register on)", err)
			}
		}
	}
	if err != nil {
		if (errors.Is(err, ErrRefused) || errors.Is(err, ErrNotRegistered)) && ctx.Err() == nil {
			r.mu.Lock()
			lru.MakeRoom(&r.refusedUsed, r.refused, MaxCachedIDs)
			r.refused[k] = Refusal{At: r.now(), Err: err}
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
	lru.MakeRoom(&r.idsUsed, r.ids, MaxCachedIDs)
	r.ids[k] = uint32(n)
	r.idsUsed.Touch(k)
	r.mu.Unlock()
	return uint32(n), nil
}

// Register registers s under subject and returns its id. Several clients
// registering the first schema of a subject at once (walrelays side by
// side, or beside Debezium) may have the registry answer the losers 409
// (Apicurio: the subject "already exists"), as it answers a schema that
// the subject's compatibility rule refuses: on 409 the schema is looked
// up (registered meanwhile by another) and registered once again before
// it is called refused. The error is the registry's, for the caller to
// Classify.
func (r *Client) Register(ctx context.Context, subject string, s sr.Schema) (int, error) {
	n, err := r.cl.RegisterSchema(ctx, subject, s, -1, -1)
	for try := 0; err != nil && conflict(err) && try < 2; try++ {
		var ss sr.SubjectSchema
		if ss, err = r.cl.LookupSchema(ctx, subject, s); err == nil {
			return ss.ID, nil
		}
		var re *sr.ResponseError
		if !errors.As(err, &re) || !NotFound(re) {
			break // an outage, or credentials refused: as Classify says
		}
		n, err = r.cl.RegisterSchema(ctx, subject, s, -1, -1)
	}
	return n, err
}

// MaxCachedIDs bounds the cache of ids (a schema is a payload's shape:
// payloads of many shapes make many); each entry is a subject, a hash and
// an id, some 100 bytes. The passthrough format bounds its ids known and
// unknown by it too.
const MaxCachedIDs = 10000

// DefaultUnusableReadInterval is the default of
// Config.UnusableReadInterval, and of the schema-first and passthrough
// formats' own.
const DefaultUnusableReadInterval = 10 * time.Second

// Refusal is an answer that found a schema or a schema id unusable (not
// registered, refused, not compiling): when it came, and its error. The
// caches of the registry formats and the inbox keep one per key, and ask
// the registry again once it is no longer Fresh.
type Refusal struct {
	At  time.Time
	Err error
}

// Fresh reports whether r is an answer (its Err set) younger than
// interval at now.
func (r Refusal) Fresh(now time.Time, interval time.Duration) bool {
	return r.Err != nil && now.Sub(r.At) < interval
}

// subjectVersion keys the references read once each.
type subjectVersion struct {
	subject string
	version int
}

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
// most Config.MaxCompiledSchemaBytes of text with the schema's
// own (checked as each is fetched: no more is fetched past the bound).
// Errors: ErrNotRegistered (a subject or version the registry lacks,
// references nested too deep, too many or too large), ErrUnauthorized, or
// an outage.
func (r *Client) References(ctx context.Context, text string, refs []sr.SchemaReference) ([]Reference, error) {
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
				return fmt.Errorf("reference %s (subject %s version %d): %w", ref.Name, ref.Subject, ref.Version, Classify(ref.Subject, err))
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

// Client is franz-go's client of the registry underneath, for reading
// schemas back and for requests this package does not wrap.
func (r *Client) Client() *sr.Client { return r.cl }

// AutoRegister reports Config.AutoRegister: whether walrelay may register
// a schema that its subject lacks.
func (r *Client) AutoRegister() bool { return r.auto }

// MaxSchemaBytes is Config.MaxSchemaBytes (with its default): the most
// bytes of schema text that ID sends.
func (r *Client) MaxSchemaBytes() int { return r.maxSchema }

// Ping asks the registry for its subjects: an error if it does not answer
// or asks to retry later (408, 425, 429: an outage, Outage is true),
// refuses the credentials (ErrUnauthorized),
// or answers something else than Confluent's API (ErrNotSchemaRegistry:
// a wrong path, another API, a web page, a redirect).
func (r *Client) Ping(ctx context.Context) error {
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

// InSubject reports whether the schema of id (which exists) is a version
// of subject, not deleted: ErrSchemaUnknown naming the subjects it is a
// version of if not, ErrUnauthorized, or another error of the registry
// (an outage). It asks GET /schemas/ids/{id}/versions (Confluent's API,
// Apicurio's ccompat API).
func (r *Client) InSubject(ctx context.Context, id uint32, subject string) error {
	if err := checkID(id); err != nil {
		return fmt.Errorf("the subjects of schema id %d: %w", id, err)
	}
	vs, err := r.cl.SchemaVersionsByID(ctx, int(id))
	if err != nil {
		// ErrSchemaUnknown: deleted since SchemaByID found it.
		return idError(fmt.Sprintf("the subjects of schema id %d (GET /schemas/ids/%d/versions)", id, id), err)
	}
	var of []string
	for _, v := range vs {
		if v.Subject == subject {
			return nil
		}
		of = append(of, fmt.Sprintf("%s version %d", v.Subject, v.Version))
	}
	if len(of) == 0 {
		return fmt.Errorf("schema id %d: %w in subject %s: it is a version of no subject (deleted)", id, ErrSchemaUnknown, subject)
	}
	const most = 5
	if len(of) > most {
		of = append(of[:most], fmt.Sprintf("%d more", len(of)-most))
	}
	return fmt.Errorf("schema id %d: %w in subject %s: it is %s", id, ErrSchemaUnknown, subject, strings.Join(of, ", "))
}

// SchemaByID returns the schema of id: ErrSchemaUnknown if the registry
// has none (an id above math.MaxInt32 without asking it), ErrUnauthorized
// if it refuses walrelay's credentials, another error if it does not
// answer.
func (r *Client) SchemaByID(ctx context.Context, id uint32) (sr.Schema, error) {
	if err := checkID(id); err != nil {
		return sr.Schema{}, fmt.Errorf("schema id %d: %w", id, err)
	}
	s, err := r.cl.SchemaByID(ctx, int(id))
	if err != nil {
		return sr.Schema{}, idError(fmt.Sprintf("schema id %d", id), err)
	}
	return s, nil
}
