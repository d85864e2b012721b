package format

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

// TestPassthroughCheck: a framed value whose id the registry has, a
// version of the topic's subject, passes (looked up once, then cached);
// an unframed one is ErrUnframed without a request; a 404 is
// ErrSchemaUnknown, a 401 ErrUnauthorized, a 5xx an outage (neither); a
// nil value (a tombstone) passes.
func TestPassthroughCheck(t *testing.T) {
	var status atomic.Int32
	var calls atomic.Int32
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		s := int(status.Load())
		w.WriteHeader(s)
		if s == http.StatusOK && strings.HasSuffix(r.URL.Path, "/versions") {
			_, _ = w.Write([]byte(`[{"subject":"orders-value","version":1}]`))
			return
		}
		if s == http.StatusOK {
			_, _ = w.Write([]byte(`{"schema":"\"string\""}`))
			return
		}
		_, _ = w.Write([]byte(`{"error_code":40403,"message":"no"}`))
	}))
	defer srv.Close()
	ctx := t.Context()
	p := mustPassthrough(t, mustRegistry(t, registry.Config{URL: srv.URL}), PassthroughConfig{})
	framed := registry.Frame(nil, 7, []byte{2, 'a'})
	for range 2 {
		if err := p.Check(ctx, "orders", "", framed); err != nil {
			t.Fatal(err)
		}
	}
	if calls.Load() != 2 {
		t.Errorf("%d requests for one id, want 2 (the schema and its subjects, then cached)", calls.Load())
	}
	for _, v := range [][]byte{{}, []byte(`{"a":1}`), {0, 0, 0, 7}, {1, 0, 0, 0, 7, 2}} {
		if err := p.Check(ctx, "orders", "", v); !errors.Is(err, ErrUnframed) {
			t.Errorf("%q: %v, want ErrUnframed", v, err)
		}
	}
	if err := p.Check(ctx, "orders", "", nil); err != nil {
		t.Errorf("tombstone: %v", err)
	}
	for _, c := range []struct {
		status int
		want   error
	}{{http.StatusNotFound, registry.ErrSchemaUnknown}, {http.StatusUnauthorized, registry.ErrUnauthorized}, {http.StatusServiceUnavailable, nil}} {
		status.Store(int32(c.status))
		err := p.Check(ctx, "orders", "", registry.Frame(nil, uint32(100+c.status), nil))
		switch {
		case err == nil:
			t.Errorf("HTTP %d: no error", c.status)
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("HTTP %d: %v, want %v", c.status, err, c.want)
		case c.want == nil && (errors.Is(err, registry.ErrSchemaUnknown) || errors.Is(err, registry.ErrUnauthorized) || errors.Is(err, ErrUnframed)):
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
	reg := mustRegistry(t, registry.Config{URL: r.URL()})
	schema := `{"type":"record","name":"Order","fields":[{"name":"id","type":"long"}]}`
	id, err := reg.Client().RegisterSchema(ctx, "orders-value", sr.Schema{Schema: schema, Type: sr.TypeAvro}, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	body, err := avro.Marshal(avro.MustParse(schema), map[string]any{"id": int64(7)})
	if err != nil {
		t.Fatal(err)
	}
	p := mustPassthrough(t, reg, PassthroughConfig{})
	if err := p.Check(ctx, "orders", "", registry.Frame(nil, uint32(id), body)); err != nil {
		t.Fatalf("registered id %d: %v", id, err)
	}
	if err := p.Check(ctx, "orders", "", registry.Frame(nil, uint32(id)+1000, body)); !errors.Is(err, registry.ErrSchemaUnknown) {
		t.Fatalf("unknown id: %v, want ErrSchemaUnknown", err)
	}
}

// TestRegistryPassthroughForeignSubject (a real Apicurio Registry:
// WALRELAY_TEST_REGISTRY=1): a value of the orders topic framed with the
// id of a payments-value schema, or of a PROTOBUF schema of audit-value,
// is ErrSchemaUnknown naming orders-value and the id's subject; the same
// schema registered in orders-value too passes (one id, two subjects);
// a deleted version no longer counts; the other strategies name their
// subject, and StrategyAny only wants the id to exist. The review's
// TestProbePassthroughForeignSchema published both.
func TestRegistryPassthroughForeignSubject(t *testing.T) {
	r := registrytest.Start(t)
	ctx := t.Context()
	reg := mustRegistry(t, registry.Config{URL: r.URL()})
	payment := `{"type":"record","name":"Payment","fields":[{"name":"amount","type":"long"}]}`
	register := func(subject, schema string, typ sr.SchemaType) uint32 {
		t.Helper()
		id, err := reg.Client().RegisterSchema(ctx, subject, sr.Schema{Schema: schema, Type: typ}, -1, -1)
		if err != nil {
			t.Fatal(err)
		}
		return uint32(id)
	}
	avroID := register("payments-value", payment, sr.TypeAvro)
	protoID := register("audit-value", "syntax = \"proto3\";\nmessage Audit { string who = 1; }\n", sr.TypeProtobuf)
	body, err := avro.Marshal(avro.MustParse(payment), map[string]any{"amount": int64(7)})
	if err != nil {
		t.Fatal(err)
	}
	// An id refused for its subject is asked about again at once (a
	// nanosecond's interval): the subject takes it below.
	topic := mustPassthrough(t, reg, PassthroughConfig{UnusableReadInterval: time.Nanosecond})
	for _, c := range []struct {
		id   uint32
		want string
	}{
		{avroID, fmt.Sprintf("schema id %d: the registry has no schema of the payload's id in subject orders-value: it is payments-value version 1", avroID)},
		{protoID, fmt.Sprintf("schema id %d: the registry has no schema of the payload's id in subject orders-value: it is audit-value version 1", protoID)},
	} {
		err := topic.Check(ctx, "orders", "OrderCreated", registry.Frame(nil, c.id, body))
		if !errors.Is(err, registry.ErrSchemaUnknown) || err.Error() != c.want {
			t.Errorf("id %d to orders: %v, want ErrSchemaUnknown %q", c.id, err, c.want)
		}
	}
	if err := topic.Check(ctx, "payments", "", registry.Frame(nil, avroID, body)); err != nil {
		t.Errorf("id %d to payments: %v", avroID, err)
	}
	// The same schema in orders-value: the same id, of both subjects.
	if id := register("orders-value", payment, sr.TypeAvro); id != avroID {
		t.Fatalf("the same schema in orders-value: id %d, want %d", id, avroID)
	}
	if err := topic.Check(ctx, "orders", "", registry.Frame(nil, avroID, body)); err != nil {
		t.Errorf("id %d, now also of orders-value: %v", avroID, err)
	}
	// Deleted from payments-value: no longer one of its versions.
	if err := reg.Client().DeleteSchema(ctx, "payments-value", 1, sr.SoftDelete); err != nil {
		t.Fatal(err)
	}
	if err := mustPassthrough(t, reg, PassthroughConfig{}).Check(ctx, "payments", "", registry.Frame(nil, avroID, body)); !errors.Is(err, registry.ErrSchemaUnknown) {
		t.Errorf("id %d to payments after its version was deleted: %v, want ErrSchemaUnknown", avroID, err)
	}
	for _, c := range []struct {
		cfg       PassthroughConfig
		topic     string
		typ       string
		id        uint32
		wantError bool
	}{
		{PassthroughConfig{Strategy: registry.StrategyType}, "orders", "audit-value", protoID, false},
		{PassthroughConfig{Strategy: registry.StrategyType}, "orders", "Audit", protoID, true},
		{PassthroughConfig{Strategy: registry.StrategyType}, "orders", "", protoID, true},
		{PassthroughConfig{Strategy: registry.StrategyTopicType}, "audit", "value", protoID, false},
		{PassthroughConfig{Strategy: registry.StrategyTopicType}, "orders", "value", protoID, true},
		{PassthroughConfig{Strategy: registry.StrategySubject, Subject: "audit-value"}, "orders", "", protoID, false},
		{PassthroughConfig{Strategy: registry.StrategySubject, Subject: "orders-value"}, "orders", "", protoID, true},
		{PassthroughConfig{Strategy: StrategyAny}, "orders", "", protoID, false},
		{PassthroughConfig{Strategy: StrategyAny}, "orders", "", protoID + 1000, true},
	} {
		err := mustPassthrough(t, reg, c.cfg).Check(ctx, c.topic, c.typ, registry.Frame(nil, c.id, body))
		if c.wantError != (err != nil) || err != nil && !errors.Is(err, registry.ErrSchemaUnknown) {
			t.Errorf("%+v, topic %s, type %q, id %d: %v, want an error: %v (ErrSchemaUnknown)", c.cfg, c.topic, c.typ, c.id, err, c.wantError)
		}
	}
}

// TestPassthroughStrategies: NewPassthrough refuses a strategy that is
// not one of Passthrough's, a subject without StrategySubject, and
// StrategySubject without one.
func TestPassthroughStrategies(t *testing.T) {
	reg := mustRegistry(t, registry.Config{URL: "http://127.0.0.1:1"})
	for _, c := range []struct {
		cfg PassthroughConfig
		ok  bool
	}{
		{PassthroughConfig{}, true},
		{PassthroughConfig{Strategy: StrategyTopic}, true},
		{PassthroughConfig{Strategy: StrategyAny}, true},
		{PassthroughConfig{Strategy: registry.StrategySubject, Subject: "s"}, true},
		{PassthroughConfig{Strategy: registry.StrategySubject}, false},
		{PassthroughConfig{Strategy: StrategyTopic, Subject: "s"}, false},
		{PassthroughConfig{Strategy: "record"}, false},
	} {
		if _, err := NewPassthrough(reg, c.cfg); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok %v", c.cfg, err, c.ok)
		}
	}
}

// mustPassthrough is NewPassthrough, failing t on an error.
func mustPassthrough(t *testing.T, reg *registry.Client, cfg PassthroughConfig) *Passthrough {
	t.Helper()
	p, err := NewPassthrough(reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPassthroughSubjectsOutage: the subjects of an id that the registry
// has are asked after it; a 5xx, or a 404 that is not Confluent's 40403
// (a registry or proxy without the endpoint), is an outage that holds the
// event, naming the request, never ErrSchemaUnknown; 40403 (the schema
// deleted in between) is ErrSchemaUnknown; a 403 ErrUnauthorized. Only
// the subject found is cached (a refusal for UnusableReadInterval, here
// a nanosecond).
func TestPassthroughSubjectsOutage(t *testing.T) {
	var status, code atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		if !strings.HasSuffix(r.URL.Path, "/versions") {
			_, _ = w.Write([]byte(`{"schema":"\"string\""}`))
			return
		}
		s := int(status.Load())
		w.WriteHeader(s)
		if s == http.StatusOK {
			_, _ = w.Write([]byte(`[{"subject":"orders-value","version":3}]`))
			return
		}
		fmt.Fprintf(w, `{"error_code":%d,"message":"no"}`, code.Load())
	}))
	defer srv.Close()
	ctx := t.Context()
	// Each answer asked for (a nanosecond's interval): a refusal is
	// otherwise remembered for UnusableReadInterval.
	p := mustPassthrough(t, mustRegistry(t, registry.Config{URL: srv.URL}), PassthroughConfig{UnusableReadInterval: time.Nanosecond})
	framed := registry.Frame(nil, 9, []byte{2, 'a'})
	for _, c := range []struct {
		status, code int
		want         error // nil: an outage
	}{
		{http.StatusServiceUnavailable, 50301, nil},
		{http.StatusNotFound, 404, nil},
		{http.StatusNotFound, 0, nil},
		{http.StatusNotFound, 40403, registry.ErrSchemaUnknown},
		{http.StatusForbidden, 40301, registry.ErrUnauthorized},
	} {
		status.Store(int32(c.status))
		code.Store(int32(c.code))
		err := p.Check(ctx, "orders", "", framed)
		switch {
		case err == nil:
			t.Errorf("HTTP %d %d: no error", c.status, c.code)
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("HTTP %d %d: %v, want %v", c.status, c.code, err, c.want)
		case c.want == nil && (errors.Is(err, registry.ErrSchemaUnknown) || errors.Is(err, registry.ErrUnauthorized)):
			t.Errorf("HTTP %d %d: %v, want an outage", c.status, c.code, err)
		case c.want == nil && !strings.Contains(err.Error(), "GET /schemas/ids/9/versions"):
			t.Errorf("HTTP %d %d: %v does not name the request", c.status, c.code, err)
		}
	}
	status.Store(http.StatusOK)
	if err := p.Check(ctx, "orders", "", framed); err != nil {
		t.Errorf("answering again: %v", err)
	}
}
