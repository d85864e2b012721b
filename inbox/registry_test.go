package inbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/format/schemafirst"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

// TestMessageSchemaID: a value in Confluent's wire format gives its id; a
// JSON value, a short one and a tombstone none.
func TestMessageSchemaID(t *testing.T) {
	for _, c := range []struct {
		v    []byte
		id   uint32
		want bool
	}{
		{registry.Frame(nil, 42, []byte{2}), 42, true},
		{registry.Frame(nil, 1<<31+5, nil), 1<<31 + 5, true},
		{[]byte(`{"id":1}`), 0, false},
		{[]byte{0, 0, 1}, 0, false},
		{nil, 0, false},
	} {
		if id, ok := (Message{Value: c.v}).SchemaID(); id != c.id || ok != c.want {
			t.Errorf("%x: %d %v, want %d %v", c.v, id, ok, c.id, c.want)
		}
	}
}

// TestRegistryDecode (a real Apicurio Registry: WALRELAY_TEST_REGISTRY=1):
// a value that walrelay's avro format wrote (its schema inferred and
// registered) decodes into a struct and into plain Go values with the
// schema the registry gives for its id; a value framed with an id the
// registry lacks is registry.ErrSchemaUnknown; an unframed one ErrNotFramed.
func TestRegistryDecode(t *testing.T) {
	r := registrytest.Start(t)
	ctx := t.Context()
	w, err := registry.New(registry.Config{URL: r.URL(), AutoRegister: true})
	if err != nil {
		t.Fatal(err)
	}
	v, err := format.NewAvroEncoder(w).Value(ctx, "orders", format.Payload{Text: []byte(`{"id": 7, "total": 1.5, "lines": [{"sku": "a"}]}`), Column: "payload", Expand: true})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := NewRegistry(RegistryConfig{URL: r.URL()})
	if err != nil {
		t.Fatal(err)
	}
	m := Message{Value: v}
	if _, ok := m.SchemaID(); !ok {
		t.Fatal("no schema id")
	}
	var o struct {
		ID    *int     `avro:"id"`
		Total *float64 `avro:"total"`
	}
	if err := reg.Decode(ctx, m.Value, &o); err != nil || o.ID == nil || *o.ID != 7 || o.Total == nil || *o.Total != 1.5 {
		t.Fatalf("into a struct: %+v, %v", o, err)
	}
	var got map[string]any
	if err := reg.Decode(ctx, m.Value, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"id": 7, "total": 1.5, "lines": []any{map[string]any{"sku": "a"}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("into a map: %#v, want %#v", got, want)
	}

	// A value that an application framed itself (registry_passthrough).
	schema := `{"type":"record","name":"Ping","fields":[{"name":"n","type":"long"}]}`
	id, err := w.Client().RegisterSchema(ctx, "pings-value", sr.Schema{Schema: schema, Type: sr.TypeAvro}, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	body, err := avro.Marshal(avro.MustParse(schema), map[string]any{"n": int64(3)})
	if err != nil {
		t.Fatal(err)
	}
	var x any
	if err := reg.Decode(ctx, registry.Frame(nil, uint32(id), body), &x); err != nil || !reflect.DeepEqual(x, map[string]any{"n": int64(3)}) {
		t.Errorf("passthrough value: %#v, %v", x, err)
	}
	if err := reg.Decode(ctx, registry.Frame(nil, uint32(id)+1000, body), &x); !errors.Is(err, registry.ErrSchemaUnknown) {
		t.Errorf("unknown id: %v", err)
	}
	if err := reg.Decode(ctx, []byte(`{"n":3}`), &x); !errors.Is(err, ErrNotFramed) {
		t.Errorf("unframed: %v", err)
	}
}

// TestRegistryAnswersClassified: what a registry answers for a schema id
// not cached decides what the consumer does with the record: a 404 is
// ErrUndecodable (dead-lettered at once), a 5xx, a 401 or 403 and no
// answer at all are ErrRegistryUnavailable (retried without limit); a
// value not framed is ErrUndecodable without a request. (The real
// registry's answers are in TestRegistryDecodeProtobuf.)
func TestRegistryAnswersClassified(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status int
		want   error
	}{
		{http.StatusNotFound, ErrUndecodable},
		{http.StatusInternalServerError, ErrRegistryUnavailable},
		{http.StatusServiceUnavailable, ErrRegistryUnavailable},
		{http.StatusUnauthorized, ErrRegistryUnavailable},
		{http.StatusForbidden, ErrRegistryUnavailable},
		{0, ErrRegistryUnavailable}, // the connection closed without an answer
	} {
		var requests atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			requests.Add(1)
			if c.status == 0 {
				hj, _ := w.(http.Hijacker)
				conn, _, _ := hj.Hijack()
				conn.Close()
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(c.status)
			fmt.Fprintf(w, `{"error_code": %d, "message": "no"}`, c.status*100+1)
		}))
		reg, err := NewRegistry(RegistryConfig{URL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		var v any
		err = reg.Decode(t.Context(), registry.Frame(nil, 9, []byte{0}), &v)
		other := ErrUndecodable
		if c.want == ErrUndecodable {
			other = ErrRegistryUnavailable
		}
		if !errors.Is(err, c.want) || errors.Is(err, other) {
			t.Errorf("HTTP %d: %v, want %v", c.status, err, c.want)
		}
		if refused := c.status == http.StatusUnauthorized || c.status == http.StatusForbidden; errors.Is(err, ErrRegistryRefused) != refused {
			t.Errorf("HTTP %d: %v: ErrRegistryRefused %v, want %v", c.status, err, !refused, refused)
		}
		before := requests.Load()
		if err := reg.Decode(t.Context(), []byte(`{"id": 1}`), &v); !errors.Is(err, ErrUndecodable) || !errors.Is(err, ErrNotFramed) || requests.Load() != before {
			t.Errorf("not framed: %v (%d requests)", err, requests.Load()-before)
		}
		srv.Close()
	}
}

// TestDecodeTargets (no registry: the schemas put in the cache as if
// fetched): each schema type decodes into each kind of target that
// Registry.Decode names, and Decoded gives the id, type and value; a nil,
// a non-pointer, a nil pointer, a message of another name and a struct
// of the wrong shape are errors, never a panic.
func TestDecodeTargets(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	fd, err := schemafirst.CompileProtobuf(ctx, `syntax = "proto3"; package google.protobuf; message Duration { int64 seconds = 1; int32 nanos = 2; } message Other { string x = 1; }`, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := NewRegistry(RegistryConfig{URL: "http://127.0.0.1:1"}) // never asked
	if err != nil {
		t.Fatal(err)
	}
	reg.schemas[1] = &schema{typ: Avro, avro: avro.MustParse(`{"type":"record","name":"P","fields":[{"name":"n","type":"long"}]}`)}
	reg.schemas[2] = &schema{typ: Protobuf, proto: fd}
	reg.schemas[3] = &schema{typ: JSONSchema}
	durBody, err := proto.Marshal(durationpb.New(90e9))
	if err != nil {
		t.Fatal(err)
	}
	avroV := registry.Frame(nil, 1, []byte{6})                              // {"n": 3}
	protoV := registry.Frame(nil, 2, append([]byte{0}, durBody...))         // Duration 90 s
	otherV := registry.Frame(nil, 2, append([]byte{2, 2}, 0x0a, 0x01, 'y')) // Other {x: "y"}
	jsonV := registry.Frame(nil, 3, []byte(`{"seconds": 90, "x": "y"}`))    // JSON
	for _, c := range []struct {
		name string
		b    []byte
		want any // the Decoded value's JSON
		typ  string
	}{
		{"avro", avroV, `{"n": 3}`, Avro},
		{"protobuf", protoV, `"90s"`, Protobuf}, // protojson's Duration
		{"protobuf other", otherV, `{"x": "y"}`, Protobuf},
		{"json", jsonV, `{"seconds": 90, "x": "y"}`, JSONSchema},
	} {
		d, err := reg.Decoded(ctx, c.b)
		if err != nil || d.Type != c.typ {
			t.Errorf("%s: %+v %v", c.name, d, err)
			continue
		}
		js, err := d.JSON()
		if err != nil || !jsonEqual(t, string(js), c.want.(string)) {
			t.Errorf("%s: JSON %s %v, want %s", c.name, js, err, c.want)
		}
	}
	var dur durationpb.Duration
	if err := reg.Decode(ctx, protoV, &dur); err != nil || dur.Seconds != 90 {
		t.Errorf("into *durationpb.Duration: %v %v", &dur, err)
	}
	var durp *durationpb.Duration
	if err := reg.Decode(ctx, protoV, &durp); err != nil || durp.GetSeconds() != 90 {
		t.Errorf("into **durationpb.Duration: %v %v", durp, err)
	}
	var fromJSON durationpb.Duration // protojson: a Duration in JSON is "90s", not an object
	if err := reg.Decode(ctx, registry.Frame(nil, 3, []byte(`"90s"`)), &fromJSON); err != nil || fromJSON.Seconds != 90 {
		t.Errorf("JSON into *durationpb.Duration: %v %v", &fromJSON, err)
	}
	var m map[string]any
	if err := reg.Decode(ctx, otherV, &m); err != nil || m["x"] != "y" {
		t.Errorf("protobuf into a map: %v %v", m, err)
	}
	var st struct {
		N int64 `avro:"n"`
	}
	if err := reg.Decode(ctx, avroV, &st); err != nil || st.N != 3 {
		t.Errorf("avro into a struct: %+v %v", st, err)
	}
	var nilDur *durationpb.Duration
	var wrongShape struct {
		X int `json:"x"`
	}
	for _, c := range []struct {
		name        string
		b           []byte
		into        any
		undecodable bool
	}{
		{"nil", protoV, nil, false},
		{"nil into avro", avroV, nil, false},
		{"not a pointer", jsonV, m, false},
		{"a nil message", protoV, nilDur, false},
		{"a nil pointer into json", jsonV, (*map[string]any)(nil), false},
		{"a nil pointer into avro", avroV, (*struct{})(nil), false},
		{"another message", otherV, &dur, true},
		{"json of the wrong shape", jsonV, &wrongShape, true},
		{"protobuf of the wrong shape", otherV, &wrongShape, true},
		{"avro into a string", avroV, new(string), true},
	} {
		err := reg.Decode(ctx, c.b, c.into)
		if err == nil || errors.Is(err, ErrUndecodable) != c.undecodable || errors.Is(err, ErrRegistryUnavailable) {
			t.Errorf("%s: %v, want an error (undecodable: %v)", c.name, err, c.undecodable)
		}
	}
}

func jsonEqual(t *testing.T, a, b string) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal([]byte(a), &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal([]byte(b), &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}

// TestDecodeShadowedWellKnownTypeUndecodable (from review44's
// TestProbe44CraftedRegistryAnswers): a schema that declares a
// well-known type of its own (package google.protobuf, message Duration
// { bool seconds = 1; }) made protojson.Marshal panic in Decode into an
// *any: only the consumer's recover of the handler caught it, and the
// record was retried as the handler's panic, not dead-lettered as
// undecodable. Such a schema is now refused when compiled (undecodable),
// and one that got compiled anyway (put in the cache here, compiled
// without the check) is undecodable too, blaming the schema, from Decode
// and Decoded's JSON. Before the fix, both Decodes printed "PANIC:
// runtime error: invalid memory address or nil pointer dereference" (a
// recover of the test's), and Decoded's JSON panicked the test.
func TestDecodeShadowedWellKnownTypeUndecodable(t *testing.T) {
	t.Parallel()
	const text = "syntax = \"proto3\";\npackage google.protobuf;\nmessage E { Duration d = 1; }\nmessage Duration { bool seconds = 1; }\n"
	url, _ := schemaServer(t, "PROTOBUF", func(int) string { return text })
	reg, err := NewRegistry(RegistryConfig{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	// E{d: Duration{seconds: true}}.
	value := registry.Frame(nil, 1, []byte{0, 0x0a, 2, 0x08, 1})
	decode := func(b []byte) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("PANIC: %v", p)
			}
		}()
		var v any
		return reg.Decode(t.Context(), b, &v)
	}
	err = decode(value)
	t.Logf("compiled from the registry: %v", err)
	if !errors.Is(err, ErrUndecodable) || !strings.Contains(err.Error(), "google.protobuf.Duration") {
		t.Errorf("%v, want ErrUndecodable naming google.protobuf.Duration", err)
	}

	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(map[string]string{"d.proto": text})})}
	files, err := c.Compile(t.Context(), "d.proto")
	if err != nil {
		t.Fatal(err)
	}
	reg.schemas[2] = &schema{typ: Protobuf, proto: files[0]}
	err = decode(registry.Frame(nil, 2, value[5:]))
	t.Logf("compiled without the check: %v", err)
	if !errors.Is(err, ErrUndecodable) || !strings.Contains(err.Error(), "its schema is at fault") {
		t.Errorf("%v, want ErrUndecodable blaming the schema", err)
	}
	d, err := reg.Decoded(t.Context(), registry.Frame(nil, 2, value[5:]))
	if err != nil {
		t.Fatal(err)
	}
	if js, err := d.JSON(); err == nil || !strings.Contains(err.Error(), "its schema is at fault") {
		t.Errorf("Decoded's JSON: %s %v, want an error blaming the schema", js, err)
	}
}
