package format

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

// beyondInt32 are framed schema ids that no registry can have: the
// framing carries 4 bytes, a registry's id is a Java int.
var beyondInt32 = []uint32{1 << 31, 1<<32 - 1}

// TestRegistryPassthroughIDBeyondInt32 (a real Apicurio Registry:
// WALRELAY_TEST_REGISTRY=1): a registry_passthrough payload framed with a
// schema id of 2^31 or more is ErrSchemaUnknown (the event dead-lettered
// schema_unknown), not an outage. Apicurio cannot read
// /schemas/ids/2147483648 as its int and answers a 404 without
// Confluent's error code, which walrelay reads as a wrong URL: one row
// held the whole stream for ever (the review's
// TestProbePassthroughIDBeyondInt32HoldsStream).
func TestRegistryPassthroughIDBeyondInt32(t *testing.T) {
	r := registrytest.Start(t)
	reg := mustRegistry(t, registry.Config{URL: r.URL(), Timeout: 10 * time.Second})
	p, err := NewPassthrough(reg, PassthroughConfig{Strategy: StrategyAny})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range beyondInt32 {
		err := p.Check(t.Context(), "orders", "OrderCreated", registry.Frame(nil, id, []byte{2}))
		if !errors.Is(err, registry.ErrSchemaUnknown) || registry.Outage(err) {
			t.Errorf("a payload framed with schema id %d: %.300v (outage %v); want ErrSchemaUnknown (dead-lettered), not the stream held for ever", id, err, registry.Outage(err))
		}
	}
}

// TestSchemaIDBeyondInt32NoRequest: SchemaByID and the passthrough's
// check of an id of 2^31 or more answer ErrSchemaUnknown without asking
// the registry, whatever it would answer (here a 404 without Confluent's
// code, read as a wrong URL for any other id).
func TestSchemaIDBeyondInt32NoRequest(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.NotFound(w, r)
	}))
	defer srv.Close()
	reg := mustRegistry(t, registry.Config{URL: srv.URL})
	for _, strategy := range []string{StrategyAny, StrategyTopic} {
		p := mustPassthrough(t, reg, PassthroughConfig{Strategy: strategy})
		for _, id := range beyondInt32 {
			if err := p.Check(t.Context(), "orders", "OrderCreated", registry.Frame(nil, id, []byte{2})); !errors.Is(err, registry.ErrSchemaUnknown) || registry.Outage(err) {
				t.Errorf("strategy %s, id %d: %v (outage %v), want ErrSchemaUnknown", strategy, id, err, registry.Outage(err))
			}
		}
	}
	for _, id := range beyondInt32 {
		if _, err := reg.SchemaByID(t.Context(), id); !errors.Is(err, registry.ErrSchemaUnknown) {
			t.Errorf("SchemaByID(%d): %v, want ErrSchemaUnknown", id, err)
		}
		if err := reg.InSubject(t.Context(), id, "orders-value"); !errors.Is(err, registry.ErrSchemaUnknown) {
			t.Errorf("inSubject(%d): %v, want ErrSchemaUnknown", id, err)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("%d requests to the registry for ids beyond int32, want none", n)
	}
}
