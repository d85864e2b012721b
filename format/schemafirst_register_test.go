package format

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

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
	cl := mustRegistry(t, RegistryConfig{URL: r.URL()}).Client()
	enc, err := NewSchemaFirst(mustRegistry(t, RegistryConfig{URL: r.URL(), AutoRegister: true}), SchemaFirstConfig{Kind: KindAvro})
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
	if err != nil || again != got {
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
	if _, err := enc.Register(ctx, "Paid", incompatible); !errors.Is(err, ErrIncompatible) || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "subject Paid") {
		t.Errorf("register an incompatible schema: %v, want ErrIncompatible naming subject Paid", err)
	}
	if vs, _ := cl.SubjectVersions(ctx, "Paid"); len(vs) != 1 {
		t.Errorf("versions of Paid %v, want [1]", vs)
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
	down, _ := NewSchemaFirst(mustRegistry(t, RegistryConfig{URL: "http://" + addr, AutoRegister: true}), SchemaFirstConfig{Kind: KindAvro})
	if _, err := down.Register(ctx, "Paid", v1); err == nil || errors.Is(err, ErrRefused) || errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrNotRegistered) {
		t.Errorf("a registry down: %v, want an outage", err)
	}
	// Auto-registration off: nothing registered.
	off, _ := NewSchemaFirst(mustRegistry(t, RegistryConfig{URL: r.URL()}), SchemaFirstConfig{Kind: KindAvro})
	if _, err := off.Register(ctx, "Other", v1); err == nil {
		t.Error("Register with auto-registration off: no error")
	}
	if subjects, _ := cl.Subjects(ctx); len(subjects) != 1 {
		t.Errorf("subjects %v, want Paid alone", subjects)
	}
}
