package schemafirst

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

// TestRegistryWrongPathHeld (a real Apicurio Registry): a URL that misses
// Confluent's API (Apicurio's base URL, or its own /apis/registry/v2)
// answers 404 to every request, with error code 404 instead of
// Confluent's 40401/40402/40403: every format takes it for a
// configuration problem held as an outage (never a schema not registered
// or an unknown id, which would dead-letter every event), naming the
// path; OnRequest reports each such answer as a failure; Ping says so.
// The right URL's 404s are still answers about the schema.
func TestRegistryWrongPathHeld(t *testing.T) {
	r := registrytest.Start(t)
	ctx := t.Context()
	for _, url := range []string{r.Base(), r.Base() + "/apis/registry/v2"} {
		reg := mustRegistry(t, registry.Config{URL: url, AutoRegister: true})
		var mu sync.Mutex
		var reported []error
		reg.OnRequest(func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() })
		held := func(what string, err error) {
			t.Helper()
			if err == nil || !registry.Outage(err) || errors.Is(err, registry.ErrNotRegistered) || errors.Is(err, registry.ErrSchemaUnknown) || errors.Is(err, registry.ErrRefused) ||
				!strings.Contains(err.Error(), "/apis/ccompat/v7") {
				t.Errorf("%s, URL %s: %v: want a configuration problem held as an outage, naming /apis/ccompat/v7", what, url, err)
			}
		}
		_, err := format.NewAvroEncoder(reg).Value(ctx, "orders", format.Payload{Text: []byte(`{"a": 1}`), Column: "payload", Expand: true})
		held("avro", err)
		held("registry_passthrough", mustPassthrough(t, reg, format.PassthroughConfig{}).Check(ctx, "orders", "", registry.Frame(nil, 1, []byte{2})))
		sf, err := New(reg, Config{Kind: KindAvro})
		if err != nil {
			t.Fatal(err)
		}
		_, err = sf.Value(ctx, "orders", "OrderCreated", []byte(`{"a": 1}`), 0)
		held("registered_avro", err)
		held("ping", reg.Ping(ctx))
		mu.Lock()
		if len(reported) == 0 {
			t.Errorf("URL %s: no request reported", url)
		}
		for _, err := range reported {
			if err == nil {
				t.Errorf("URL %s: a 404 without Confluent's error code reported as an answer (status: answering)", url)
				break
			}
		}
		mu.Unlock()
	}
	reg := mustRegistry(t, registry.Config{URL: r.URL()})
	var answered atomic.Int32
	reg.OnRequest(func(err error) {
		if err == nil {
			answered.Add(1)
		}
	})
	if err := reg.Ping(ctx); err != nil {
		t.Errorf("ping of %s: %v", r.URL(), err)
	}
	if err := mustPassthrough(t, reg, format.PassthroughConfig{}).Check(ctx, "orders", "", registry.Frame(nil, 1<<30, []byte{2})); !errors.Is(err, registry.ErrSchemaUnknown) {
		t.Errorf("an unknown id at the right URL: %v, want ErrSchemaUnknown", err)
	}
	if _, err := reg.ID(ctx, "wrongpath-value", `"string"`); !errors.Is(err, registry.ErrNotRegistered) {
		t.Errorf("an unregistered schema at the right URL: %v, want ErrNotRegistered", err)
	}
	if answered.Load() != 3 {
		t.Errorf("%d of 3 requests at the right URL reported as answered", answered.Load())
	}
}

// TestRegistryNotRegisteredWording (a real Apicurio Registry): the error
// of a schema not registered says why walrelay did not register it, by
// kafka.schema_registry.auto_register: off, it registers nothing; on, a
// schema-first format registers only the schema files given.
func TestRegistryNotRegisteredWording(t *testing.T) {
	r := registrytest.Start(t)
	ctx := t.Context()
	off := mustRegistry(t, registry.Config{URL: r.URL()})
	_, err := format.NewAvroEncoder(off).Value(ctx, "wording", format.Payload{Text: []byte(`{"a": 1}`), Column: "payload", Expand: true})
	if !errors.Is(err, registry.ErrNotRegistered) || !strings.Contains(err.Error(), "auto_register is off") {
		t.Errorf("avro, auto_register off: %v", err)
	}
	for _, auto := range []bool{false, true} {
		sf, err := New(mustRegistry(t, registry.Config{URL: r.URL(), AutoRegister: auto}), Config{Kind: KindAvro})
		if err != nil {
			t.Fatal(err)
		}
		_, err = sf.Value(ctx, "orders", "NeverRegistered", []byte(`{"a": 1}`), 0)
		want := "auto_register is off"
		if auto {
			want = "registers only the schema files"
		}
		if !errors.Is(err, registry.ErrNotRegistered) || !strings.Contains(err.Error(), want) || (auto && strings.Contains(err.Error(), "is off")) {
			t.Errorf("registered_avro, auto_register %v: %v, want it to say %q", auto, err, want)
		}
	}
}

// TestRegistryConcurrentFirstRegistration (a real Apicurio Registry):
// clients (each its own Registry, as separate walrelay processes) writing
// the first value of a new subject at once: Apicurio answers the racing
// registrations 409 ("already exists"); each looks the schema up and uses
// its id instead of dead-lettering the event as refused; schema-first
// walrelays registering the same schema file at start likewise. A schema
// that the subject's rule refuses is still refused.
func TestRegistryConcurrentFirstRegistration(t *testing.T) {
	r := registrytest.Start(t)
	const n = 8
	for round := range 3 {
		subject := fmt.Sprintf("conc%d", round)
		var wg sync.WaitGroup
		ids := make([]uint32, n)
		errs := make([]error, n)
		start := make(chan struct{})
		for i := range ids {
			enc := format.NewAvroEncoder(mustRegistry(t, registry.Config{URL: r.URL(), AutoRegister: true}))
			wg.Go(func() {
				<-start
				v, err := enc.Value(t.Context(), subject, format.Payload{Text: []byte(`{"a": 1, "b": [{"c": "x"}]}`), Column: "payload", Expand: true})
				if err == nil {
					ids[i], _, err = registry.Unframe(v)
				}
				errs[i] = err
			})
		}
		close(start)
		wg.Wait()
		for i := range ids {
			if errs[i] != nil {
				t.Errorf("%s, client %d: %v (dead-lettered as schema_refused)", subject, i, errs[i])
			} else if ids[i] != ids[0] {
				t.Errorf("%s, client %d: id %d, client 0: %d", subject, i, ids[i], ids[0])
			}
		}
	}
	// Schema-first: walrelays started at once, registering the same
	// schema file.
	var wg sync.WaitGroup
	got := make([]Registered, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range got {
		sf, err := New(mustRegistry(t, registry.Config{URL: r.URL(), AutoRegister: true}), Config{Kind: KindAvro})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			<-start
			got[i], errs[i] = sf.Register(t.Context(), "ConcCreated", `{"type":"record","name":"ConcCreated","fields":[{"name":"id","type":"long"}]}`)
		})
	}
	close(start)
	wg.Wait()
	for i := range got {
		if errs[i] != nil || got[i].ID != got[0].ID {
			t.Errorf("schema-first Register, walrelay %d: %+v, %v (walrelay 0: id %d)", i, got[i], errs[i], got[0].ID)
		}
	}
	reg := mustRegistry(t, registry.Config{URL: r.URL(), AutoRegister: true})
	if res := reg.Client().SetCompatibility(t.Context(), sr.SetCompatibility{Level: sr.CompatFull}, "conc0-value"); len(res) != 1 || res[0].Err != nil {
		t.Fatalf("set compatibility: %+v", res)
	}
	if _, err := reg.ID(t.Context(), "conc0-value", `"string"`); !errors.Is(err, registry.ErrRefused) {
		t.Errorf("an incompatible schema: %v, want ErrRefused", err)
	}
}

// TestRegistrySchemaFirstNewVersionDuringOutage (a real Apicurio
// Registry): the application registers version 2 of its event's schema
// and writes payloads of it; walrelay knows version 1. Such a payload is
// written in version 2 at once (the latest read again before a mismatch,
// however recently version 1 was learnt); while the registry does not
// answer, it is held (an outage), never dead-lettered as a mismatch; a
// payload that fits no version is a mismatch once the registry answers.
// Every mismatch may read the latest again here (MismatchReadInterval
// 1ns): how often one does is TestSchemaFirstMismatchReadBounded's.
func TestRegistrySchemaFirstNewVersionDuringOutage(t *testing.T) {
	r := registrytest.Start(t)
	px := r.Proxy(t)
	direct := mustRegistry(t, registry.Config{URL: r.URL()})
	v1 := `{"type":"record","name":"OrderCreated","fields":[{"name":"id","type":"long"}]}`
	v2 := `{"type":"record","name":"OrderCreated","fields":[{"name":"id","type":"long"},{"name":"note","type":["null","string"],"default":null}]}`
	v3 := `{"type":"record","name":"OrderCreated","fields":[{"name":"id","type":"long"},{"name":"note","type":["null","string"],"default":null},{"name":"qty","type":["null","int"],"default":null}]}`
	register(t, direct.Client(), "OrderCreated", sr.Schema{Schema: v1, Type: sr.TypeAvro})
	enc, err := New(mustRegistry(t, registry.Config{URL: "http://" + px.Addr() + registrytest.CCompatPath, Timeout: time.Second}), Config{Kind: KindAvro, LatestTTL: time.Hour, MismatchReadInterval: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := enc.Value(ctx, "orders", "OrderCreated", []byte(`{"id": 1}`), 0); err != nil {
		t.Fatal(err)
	}
	id2 := register(t, direct.Client(), "OrderCreated", sr.Schema{Schema: v2, Type: sr.TypeAvro})
	out, err := enc.Value(ctx, "orders", "OrderCreated", []byte(`{"id": 2, "note": "v2"}`), 0)
	if got, _, _ := registry.Unframe(out); err != nil || got != uint32(id2) {
		t.Errorf("a version-2 payload right after version 1 was learnt: id %d, %v; want version 2's id %d", got, err, id2)
	}
	register(t, direct.Client(), "OrderCreated", sr.Schema{Schema: v3, Type: sr.TypeAvro})
	px.Down()
	_, err = enc.Value(ctx, "orders", "OrderCreated", []byte(`{"id": 3, "qty": 2}`), 0)
	if err == nil || errors.Is(err, ErrMismatch) || !registry.Outage(err) {
		t.Errorf("a version-3 payload while the registry is down: %v, want an outage (held)", err)
	}
	if _, err := enc.Value(ctx, "orders", "OrderCreated", []byte(`{"id": 4, "note": "fits v2"}`), 0); err != nil {
		t.Errorf("a payload that fits the known version while the registry is down: %v", err)
	}
	px.Up()
	if _, err := enc.Value(ctx, "orders", "OrderCreated", []byte(`{"id": 3, "qty": 2}`), 0); err != nil {
		t.Errorf("the version-3 payload once the registry answers: %v", err)
	}
	_, err = enc.Value(ctx, "orders", "OrderCreated", []byte(`{"id": 5, "nope": 1}`), 0)
	wantMismatch(t, "a payload that fits no version", err, "/nope")
}

// TestSchemaFirstAvroFloatRange: a number beyond a float32's range in an
// Avro float is a mismatch (Avro would carry an infinity the JSON did not
// say), as a number beyond a double's is; the largest float32 fits.
func TestSchemaFirstAvroFloatRange(t *testing.T) {
	mismatch := func(field, reason string) *MismatchError {
		return &MismatchError{Subject: "s", Version: 1, Field: field, Reason: reason}
	}
	w, err := uncapped(compileAvro(`{"type":"record","name":"R","fields":[{"name":"f","type":"float"},{"name":"d","type":"double"}]}`, nil, mismatch))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		in    string
		field string // "" if it fits
	}{
		{`{"f": 1e39, "d": 1}`, "/f"},
		{`{"f": -1e39, "d": 1}`, "/f"},
		{`{"f": 3.4028234663852886e38, "d": 1}`, ""},
		{`{"f": 1e-50, "d": 1}`, ""}, // underflows to 0, as Java's (float) does
		{`{"f": 1, "d": 1e39}`, ""},
		{`{"f": 1, "d": 1e400}`, "/d"},
	} {
		out, merr := w(nil, []byte(c.in))
		switch {
		case c.field == "" && merr != nil:
			t.Errorf("%s: %v", c.in, merr)
		case c.field != "" && merr == nil:
			t.Errorf("%s: written (%x), want a mismatch at %s", c.in, out, c.field)
		case c.field != "" && merr.Field != c.field:
			t.Errorf("%s: mismatch at %s (%v), want %s", c.in, merr.Field, merr, c.field)
		}
	}
}

// TestRegistryAnswerSizeBounded: a registry (or a proxy in front of one)
// answering a huge body: the answer is read up to 16 MiB and refused
// beyond, with an error that says so (an outage, reported to OnRequest),
// instead of costing its size in memory; one with a Content-Length
// beyond it is not read at all.
func TestRegistryAnswerSizeBounded(t *testing.T) {
	const size = 256 << 20
	chunk := []byte(strings.Repeat("a", 1<<20))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		if strings.HasPrefix(r.URL.Path, "/length/") {
			w.Header().Set("Content-Length", fmt.Sprint(size+13))
		}
		_, _ = w.Write([]byte(`{"schema":"`))
		for range size >> 20 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		_, _ = w.Write([]byte(`"}`))
	}))
	defer srv.Close()
	for _, url := range []string{srv.URL, srv.URL + "/length"} {
		reg := mustRegistry(t, registry.Config{URL: url})
		var reported atomic.Value
		reg.OnRequest(func(err error) {
			if err != nil {
				reported.Store(err)
			}
		})
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		err := mustPassthrough(t, reg, format.PassthroughConfig{}).Check(t.Context(), "orders", "", registry.Frame(nil, 1, []byte{2}))
		runtime.ReadMemStats(&after)
		alloc := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s: allocated %d MiB: %v", url, alloc>>20, err)
		if alloc > 100<<20 { // about 34 MiB (69 with -race): what io.ReadAll grows to for 16 MiB
			t.Errorf("%s: one answer of %d MiB allocated %d MiB: no bound on an answer's size", url, size>>20, alloc>>20)
		}
		if err == nil || !registry.Outage(err) || !strings.Contains(err.Error(), "larger than 16 MiB") {
			t.Errorf("%s: %v, want an outage saying the answer is larger than 16 MiB", url, err)
		}
		if e, _ := reported.Load().(error); e == nil || !strings.Contains(e.Error(), "larger than 16 MiB") {
			t.Errorf("%s: OnRequest given %v", url, e)
		}
	}
}

// TestRegistryHugeSchemaDeadLettered: a schema inferred from a payload
// that is larger than a registry keeps (its text beyond 1 MiB) is the
// payload's error (ErrPayload: dead-lettered, reason format), never sent;
// a registry refusing a schema as too large (413) refuses it
// (ErrRefused: dead-lettered, schema_refused), instead of holding the
// stream for ever as an outage.
func TestRegistryHugeSchemaDeadLettered(t *testing.T) {
	var requests atomic.Int32
	status := http.StatusRequestEntityTooLarge
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"error_code": 413, "message": "Request Entity Too Large"}`))
	}))
	defer srv.Close()
	reg := mustRegistry(t, registry.Config{URL: srv.URL, AutoRegister: true})
	var b strings.Builder
	b.WriteString(`{"type":"record","name":"payload","fields":[`)
	for i := 0; b.Len() <= 1<<20; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"name":"k%d","type":["null","int"],"default":null}`, i)
	}
	b.WriteString(`]}`)
	_, err := reg.ID(t.Context(), "orders-value", b.String())
	if !errors.Is(err, registry.ErrPayload) || !strings.Contains(err.Error(), "bytes") || requests.Load() != 0 {
		t.Errorf("a %d-byte schema: %.300v (%d requests), want ErrPayload naming its size, before any request", b.Len(), err, requests.Load())
	}
	_, err = reg.ID(t.Context(), "orders-value", `{"type":"record","name":"payload","fields":[{"name":"a","type":"long"}]}`)
	if !errors.Is(err, registry.ErrRefused) {
		t.Errorf("HTTP 413: %v, want ErrRefused", err)
	}
}

// TestRegistryErrorTextBounded: a registry (or a proxy) answering a 5xx
// with a large page: walrelay's error, logged at each retry, carries at
// most about 1,000 bytes of it, and is still the outage it is.
func TestRegistryErrorTextBounded(t *testing.T) {
	page := "<html>" + strings.Repeat("x", 200<<10) + "</html>"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		_, _ = w.Write([]byte(page))
	}))
	defer srv.Close()
	reg := mustRegistry(t, registry.Config{URL: srv.URL, AutoRegister: true})
	_, err := reg.ID(t.Context(), "t-value", `"string"`)
	var re *sr.ResponseError
	if err == nil || !registry.Outage(err) || !errors.As(err, &re) || re.StatusCode != http.StatusBadGateway || len(err.Error()) > 1200 {
		t.Errorf("a 502 with a %d-byte page: a %d-byte error (%.200v…), want an outage of at most about 1,000 bytes", len(page), len(err.Error()), err)
	}
	err = mustPassthrough(t, reg, format.PassthroughConfig{}).Check(t.Context(), "orders", "", registry.Frame(nil, 1, []byte{2}))
	if err == nil || !registry.Outage(err) || len(err.Error()) > 1200 {
		t.Errorf("passthrough, a 502 with a %d-byte page: a %d-byte error", len(page), len(err.Error()))
	}
}
