package format

import (
	"errors"
	"testing"

	"github.com/hamba/avro/v2"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

// TestRegistryAvroRoundTrip (a real Apicurio Registry: WALRELAY_TEST_REGISTRY=1):
// keys and values written by AvroEncoder carry the id that the registry
// gives their schema under <topic>-key and <topic>-value, and decode with
// the schema the registry returns for that id to what was written; the
// same schema is registered once (one id); without auto-registration an
// unregistered schema is ErrNotRegistered.
func TestRegistryAvroRoundTrip(t *testing.T) {
	r := registrytest.Start(t)
	reg, err := registry.New(registry.Config{URL: r.URL(), AutoRegister: true})
	if err != nil {
		t.Fatal(err)
	}
	enc := NewAvroEncoder(reg)
	ctx := t.Context()
	in := `{"order": {"id": 7, "lines": [{"sku": "a", "qty": 2}, {"sku": "b", "price": 1.5}]}, "total": 4294967296, "note": null}`
	v, err := enc.Value(ctx, "outbox.event.order", Payload{Text: []byte(in), Column: "payload", Expand: true})
	if err != nil {
		t.Fatal(err)
	}
	id, body, err := registry.Unframe(v)
	if err != nil {
		t.Fatal(err)
	}
	got, err := reg.Client().SchemaByID(ctx, int(id))
	if err != nil {
		t.Fatalf("schema %d: %v", id, err)
	}
	roundTrip(t, got.Schema, body, in)
	if latest, err := reg.Client().SchemaByVersion(ctx, "outbox.event.order-value", -1); err != nil || latest.ID != int(id) {
		t.Errorf("outbox.event.order-value's latest: id %d %v, want %d", latest.ID, err, id)
	}

	// Another encoder (another process): the same id.
	enc2 := NewAvroEncoder(mustRegistry(t, registry.Config{URL: r.URL(), AutoRegister: true}))
	v2, err := enc2.Value(ctx, "outbox.event.order", Payload{Text: []byte(in), Column: "payload", Expand: true})
	if err != nil {
		t.Fatal(err)
	}
	if id2, _, _ := registry.Unframe(v2); id2 != id {
		t.Errorf("registered again: id %d, want %d", id2, id)
	}

	k, err := enc.Key(ctx, "outbox.event.order", []byte("order-7"), KeyColumn{})
	if err != nil {
		t.Fatal(err)
	}
	kid, kbody, _ := registry.Unframe(k)
	ks, err := reg.Client().SchemaByID(ctx, int(kid))
	if err != nil {
		t.Fatal(err)
	}
	var key string
	if err := avro.Unmarshal(avro.MustParse(ks.Schema), kbody, &key); err != nil || key != "order-7" {
		t.Errorf("key %q %v, want order-7", key, err)
	}

	// A payload left a string (not JSON): io.debezium.data.Json.
	v, err = enc.Value(ctx, "outbox.event.order", Payload{Text: []byte("plain"), Column: "payload", Expand: true})
	if err != nil {
		t.Fatal(err)
	}
	sid, _, _ := registry.Unframe(v)
	if ss, err := reg.Client().SchemaByID(ctx, int(sid)); err != nil || ss.Schema != `["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]` {
		t.Errorf("schema of a string payload: %q %v", ss.Schema, err)
	}

	strict := NewAvroEncoder(mustRegistry(t, registry.Config{URL: r.URL()}))
	if _, err := strict.Value(ctx, "outbox.event.other", Payload{Text: []byte(`{"a": 1}`), Column: "payload", Expand: true}); !errors.Is(err, registry.ErrNotRegistered) {
		t.Errorf("unregistered without auto-registration: %v, want ErrNotRegistered", err)
	}
	if _, err := strict.Value(ctx, "outbox.event.order", Payload{Text: []byte(in), Column: "payload", Expand: true}); err != nil {
		t.Errorf("registered schema without auto-registration: %v", err)
	}
}

func mustRegistry(t *testing.T, cfg registry.Config) *registry.Client {
	t.Helper()
	reg, err := registry.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}
