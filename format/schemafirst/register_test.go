package schemafirst

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

// TestRegistrySchemaFirstRegister (a real Apicurio Registry): with
// auto-registration on, Register registers a schema-first schema under
// its subject (a new subject's version 1; the same text again is the same
// version, no new one) and Plan says what it would do without doing it; a
// schema the subject's compatibility rule refuses (HTTP 409) is
// ErrIncompatible, naming the subject, in both; a schema walrelay cannot
// compile is refused before any request; a registry that does not answer
// is neither (an outage); with auto-registration off, Register refuses.
func TestRegistrySchemaFirstRegister(t *testing.T) {
	r := registrytest.Start(t)
	ctx := t.Context()
	cl := mustRegistry(t, registry.Config{URL: r.URL()}).Client()
	enc, err := New(mustRegistry(t, registry.Config{URL: r.URL(), AutoRegister: true}), Config{Kind: KindAvro})
	if err != nil {
		t.Fatal(err)
	}
	v1 := `{"type":"record","name":"Paid","namespace":"shop","fields":[{"name":"id","type":"long"}]}`
	if plan, err := enc.Plan(ctx, "Paid", v1); err != nil || !strings.Contains(plan, "version 1 of a new subject") {
		t.Errorf("plan for a new subject: %q %v", plan, err)
	}
	if subjects, _ := cl.Subjects(ctx); len(subjects) != 0 {
		t.Fatalf("Plan registered: %v", subjects)
	}
	got, err := enc.Register(ctx, "Paid", v1)
	if err != nil || got.Version != 1 || got.ID <= 0 {
		t.Fatalf("register: %+v %v", got, err)
	}
	again, err := enc.Register(ctx, "Paid", v1)
	if err != nil || again != got || got.Latest != 1 {
		t.Errorf("register the same schema again: %+v %v, want %+v", again, err, got)
	}
	if plan, err := enc.Plan(ctx, "Paid", v1); err != nil || !strings.Contains(plan, "registered already") {
		t.Errorf("plan for a registered schema: %q %v", plan, err)
	}
	v2 := strings.Replace(v1, `]}`, `,{"name":"note","type":"string","default":""}]}`, 1)
	if plan, err := enc.Plan(ctx, "Paid", v2); err != nil || !strings.Contains(plan, "new version") {
		t.Errorf("plan for a compatible new version: %q %v", plan, err)
	}
	if c := cl.SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatBackward}, "Paid"); c[0].Err != nil {
		t.Fatal(c[0].Err)
	}
	incompatible := strings.Replace(v1, `]}`, `,{"name":"qty","type":"int"}]}`, 1)
	if _, err := enc.Plan(ctx, "Paid", incompatible); !errors.Is(err, ErrIncompatible) || !strings.Contains(err.Error(), "Paid") {
		t.Errorf("plan for an incompatible schema: %v, want ErrIncompatible naming Paid", err)
	}
	if _, err := enc.Register(ctx, "Paid", incompatible); !errors.Is(err, ErrIncompatible) || !errors.Is(err, registry.ErrRefused) || !strings.Contains(err.Error(), "subject Paid") {
		t.Errorf("register an incompatible schema: %v, want ErrIncompatible naming subject Paid", err)
	}
	if vs, _ := cl.SubjectVersions(ctx, "Paid"); len(vs) != 1 {
		t.Errorf("versions of Paid %v, want [1]", vs)
	}
	// A newer version registered by others: the file's, version 1, is
	// registered already but is not the latest, and Plan and Register say
	// so.
	if c := cl.SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatNone}, "Paid"); c[0].Err != nil {
		t.Fatal(c[0].Err)
	}
	register(t, cl, "Paid", sr.Schema{Schema: v2, Type: sr.TypeAvro})
	if plan, err := enc.Plan(ctx, "Paid", v1); err != nil || !strings.Contains(plan, "registered already: version 1") || !strings.Contains(plan, "not the latest (version 2") {
		t.Errorf("plan for an older version: %q %v", plan, err)
	}
	if old, err := enc.Register(ctx, "Paid", v1); err != nil || old.Version != 1 || old.Latest != 2 {
		t.Errorf("register an older version: %+v %v, want version 1, latest 2", old, err)
	}
	if _, err := enc.Register(ctx, "Broken", `{"type":"record","name":"B","fields":[{"name":"x","type":"nope"}]}`); err == nil || errors.Is(err, ErrIncompatible) {
		t.Errorf("a schema walrelay cannot parse: %v", err)
	}
	if subjects, _ := cl.Subjects(ctx); len(subjects) != 1 {
		t.Errorf("subjects %v, want Paid alone", subjects)
	}

	// A registry that does not answer: an outage, not a refusal.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	down, _ := New(mustRegistry(t, registry.Config{URL: "http://" + addr, AutoRegister: true}), Config{Kind: KindAvro})
	if _, err := down.Register(ctx, "Paid", v1); err == nil || errors.Is(err, registry.ErrRefused) || errors.Is(err, registry.ErrUnauthorized) || errors.Is(err, registry.ErrNotRegistered) {
		t.Errorf("a registry down: %v, want an outage", err)
	}
	// Auto-registration off: nothing registered.
	off, _ := New(mustRegistry(t, registry.Config{URL: r.URL()}), Config{Kind: KindAvro})
	if _, err := off.Register(ctx, "Other", v1); err == nil {
		t.Error("Register with auto-registration off: no error")
	}
	if subjects, _ := cl.Subjects(ctx); len(subjects) != 1 {
		t.Errorf("subjects %v, want Paid alone", subjects)
	}
}

// TestRegistrySchemaFirstRegisterKinds (a real Apicurio Registry): a
// Protobuf and a JSON Schema file are registered with their kind, and the
// encoder then writes with the version registered; a schema of the
// format's kind that walrelay cannot compile (a Protobuf message that the
// configuration names and the file lacks) is ErrInvalid, before any
// request.
func TestRegistrySchemaFirstRegisterKinds(t *testing.T) {
	r := registrytest.Start(t)
	ctx := t.Context()
	cl := mustRegistry(t, registry.Config{URL: r.URL()}).Client()
	for _, c := range []struct {
		kind, message, schema, payload string
		typ                            sr.SchemaType
	}{
		{KindProtobuf, "shop.Paid", `syntax = "proto3"; package shop; message Other { int32 x = 1; } message Paid { int64 id = 1; }`, `{"id": "3"}`, sr.TypeProtobuf},
		{KindJSONSchema, "", `{"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]}`, `{"id": 3}`, sr.TypeJSON},
	} {
		enc, err := New(mustRegistry(t, registry.Config{URL: r.URL(), AutoRegister: true}), Config{Kind: c.kind, Message: c.message})
		if err != nil {
			t.Fatal(err)
		}
		subject := "Paid" + c.kind
		got, err := enc.Register(ctx, subject, c.schema)
		if err != nil {
			t.Fatalf("%s: %v", c.kind, err)
		}
		ss, err := cl.SchemaByVersion(ctx, subject, -1)
		if err != nil || ss.Type != c.typ || ss.ID != got.ID {
			t.Errorf("%s: registered %+v %v, want type %s id %d", c.kind, ss, err, c.typ, got.ID)
		}
		v, err := enc.Value(ctx, "t", subject, []byte(c.payload), 0)
		if id, _, _ := registry.Unframe(v); err != nil || int(id) != got.ID {
			t.Errorf("%s: written with id %d %v, want %d", c.kind, id, err, got.ID)
		}
	}
	enc, _ := New(mustRegistry(t, registry.Config{URL: r.URL(), AutoRegister: true}), Config{Kind: KindProtobuf, Message: "shop.Missing"})
	if _, err := enc.Register(ctx, "NoMessage", `syntax = "proto3"; package shop; message Paid { int64 id = 1; }`); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("a .proto without the configured message: %v, want ErrInvalid", err)
	}
	if _, err := cl.SchemaByVersion(ctx, "NoMessage", -1); err == nil {
		t.Error("NoMessage was registered")
	}
}
