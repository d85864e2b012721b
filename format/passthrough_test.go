package format

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

// TestPassthroughCheck: a framed value whose id the registry has passes
// (looked up once, then cached); an unframed one is ErrUnframed without a
// request; a 404 is ErrSchemaUnknown, a 401 ErrUnauthorized, a 5xx an
// outage (neither); a nil value (a tombstone) passes.
func TestPassthroughCheck(t *testing.T) {
	var status atomic.Int32
	var calls atomic.Int32
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		s := int(status.Load())
		w.WriteHeader(s)
		if s == http.StatusOK {
			_, _ = w.Write([]byte(`{"schema":"\"string\""}`))
			return
		}
		_, _ = w.Write([]byte(`{"error_code":40403,"message":"no"}`))
	}))
	defer srv.Close()
	ctx := t.Context()
	p := NewPassthrough(mustRegistry(t, RegistryConfig{URL: srv.URL}))
	framed := Frame(nil, 7, []byte{2, 'a'})
	for range 2 {
		if err := p.Check(ctx, framed); err != nil {
			t.Fatal(err)
		}
	}
	if calls.Load() != 1 {
		t.Errorf("%d requests for one id, want 1 (cached)", calls.Load())
	}
	for _, v := range [][]byte{{}, []byte(`{"a":1}`), {0, 0, 0, 7}, {1, 0, 0, 0, 7, 2}} {
		if err := p.Check(ctx, v); !errors.Is(err, ErrUnframed) {
			t.Errorf("%q: %v, want ErrUnframed", v, err)
		}
	}
	if err := p.Check(ctx, nil); err != nil {
		t.Errorf("tombstone: %v", err)
	}
	for _, c := range []struct {
		status int
		want   error
	}{{http.StatusNotFound, ErrSchemaUnknown}, {http.StatusUnauthorized, ErrUnauthorized}, {http.StatusServiceUnavailable, nil}} {
		status.Store(int32(c.status))
		err := p.Check(ctx, Frame(nil, uint32(100+c.status), nil))
		switch {
		case err == nil:
			t.Errorf("HTTP %d: no error", c.status)
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("HTTP %d: %v, want %v", c.status, err, c.want)
		case c.want == nil && (errors.Is(err, ErrSchemaUnknown) || errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrUnframed)):
			t.Errorf("HTTP %d: %v, want an outage", c.status, err)
		case !strings.Contains(err.Error(), "schema id"):
			t.Errorf("HTTP %d: %v does not name the id", c.status, err)
		}
	}
}

// TestRegistryPassthrough (a real Apicurio Registry:
// WALRELAY_TEST_REGISTRY=1): a value that an application serialized
// itself, framed with the id the registry gave its schema, passes; a
// framed id that the registry does not have is ErrSchemaUnknown.
func TestRegistryPassthrough(t *testing.T) {
	r := registrytest.Start(t)
	ctx := t.Context()
	reg := mustRegistry(t, RegistryConfig{URL: r.URL()})
	schema := `{"type":"record","name":"Order","fields":[{"name":"id","type":"long"}]}`
	id, err := reg.Client().RegisterSchema(ctx, "orders-value", sr.Schema{Schema: schema, Type: sr.TypeAvro}, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	body, err := avro.Marshal(avro.MustParse(schema), map[string]any{"id": int64(7)})
	if err != nil {
		t.Fatal(err)
	}
	p := NewPassthrough(reg)
	if err := p.Check(ctx, Frame(nil, uint32(id), body)); err != nil {
		t.Fatalf("registered id %d: %v", id, err)
	}
	if err := p.Check(ctx, Frame(nil, uint32(id)+1000, body)); !errors.Is(err, ErrSchemaUnknown) {
		t.Fatalf("unknown id: %v, want ErrSchemaUnknown", err)
	}
}
