package registrytest

import (
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
)

// TestRegistryServesCCompat starts the registry and registers a schema
// through its Confluent-compatible API.
func TestRegistryServesCCompat(t *testing.T) {
	r := Start(t)
	cl, err := sr.NewClient(sr.URLs(r.URL()))
	if err != nil {
		t.Fatal(err)
	}
	s := sr.Schema{Schema: `{"type":"record","name":"r","fields":[{"name":"a","type":"long"}]}`, Type: sr.TypeAvro}
	id, err := cl.RegisterSchema(t.Context(), "t-value", s, -1, -1)
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	again, err := cl.RegisterSchema(t.Context(), "t-value", s, -1, -1)
	if err != nil || again != id {
		t.Fatalf("register again: id %d, %v; want %d", again, err, id)
	}
	got, err := cl.SchemaByID(t.Context(), id)
	if err != nil {
		t.Fatalf("schema by id %d: %v", id, err)
	}
	t.Logf("id %d: %s", id, got.Schema)
}
