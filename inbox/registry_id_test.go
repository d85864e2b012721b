package inbox

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

// TestRegistryIDBeyondInt32Undecodable (a real Apicurio Registry:
// WALRELAY_TEST_REGISTRY=1): a record framed with a schema id of 2^31 or
// more (the framing carries 4 bytes, a registry's id is a Java int) is
// ErrUndecodable, dead-lettered, not ErrRegistryUnavailable: Apicurio
// answers /schemas/ids/2147483648 with a 404 without Confluent's code,
// which held the partition for ever on that one record (the review's
// TestProbeRegistryIDBeyondInt32HoldsPartition).
func TestRegistryIDBeyondInt32Undecodable(t *testing.T) {
	r := registrytest.Start(t)
	reg, err := NewRegistry(RegistryConfig{URL: r.URL(), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint32{1 << 31, 1<<32 - 1} {
		var v any
		err := reg.Decode(t.Context(), registry.Frame(nil, id, []byte{2}), &v)
		if !errors.Is(err, ErrUndecodable) {
			t.Errorf("a record framed with schema id %d: %v; want ErrUndecodable (dead-lettered), not a partition held for ever", id, err)
		}
	}
}

// TestRegistryIDBeyondInt32NoRequest: Decode and Decoded of a record
// framed with an id beyond int32 are ErrUndecodable without a request to
// the registry (whatever it would answer: here a 404 without Confluent's
// code, an outage for any other id).
func TestRegistryIDBeyondInt32NoRequest(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.NotFound(w, r)
	}))
	defer srv.Close()
	reg, err := NewRegistry(RegistryConfig{URL: srv.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	framed := registry.Frame(nil, 1<<31, []byte{2})
	var v any
	if err := reg.Decode(t.Context(), framed, &v); !errors.Is(err, ErrUndecodable) {
		t.Errorf("Decode: %v, want ErrUndecodable", err)
	}
	if _, err := reg.Decoded(t.Context(), framed); !errors.Is(err, ErrUndecodable) {
		t.Errorf("Decoded: %v, want ErrUndecodable", err)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("%d requests to the registry, want none", n)
	}
}
