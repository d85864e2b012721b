package schemafirst

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

// oddTypes are event types that cannot name a subject: URL path segments
// that a server normalizes away (".", ".."), control characters, text that
// is not UTF-8, or longer than a subject may be (a request line of 70 KB
// gets no answer at all).
var oddTypes = []string{".", "..", "a\nb", "\x00", "tab\there", "\xff\xfe", strings.Repeat("x", registry.MaxSubjectBytes+1), strings.Repeat("x", 70000)}

// shown is typ cut for a test's message.
func shown(typ string) string {
	if len(typ) > 20 {
		return typ[:10] + "…"
	}
	return typ
}

// TestSubjectFromTypeCheckedBeforeRequest: under the type and topic_type
// strategies the subject is the event's type, the application's data; a
// type that cannot name a subject is the event's error (dead-lettered:
// ErrNotRegistered in the schema-first formats, ErrSchemaUnknown in
// registry_passthrough, the error naming the type), never a request
// whose answer (a 404 of a normalized path, no answer) is an outage that
// holds the whole stream for ever.
func TestSubjectFromTypeCheckedBeforeRequest(t *testing.T) {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusNotFound) // a path the API does not serve, as /versions/latest
	}))
	defer srv.Close()
	reg := mustRegistry(t, registry.Config{URL: srv.URL})
	for _, strategy := range []string{registry.StrategyType, registry.StrategyTopicType} {
		enc, err := New(reg, Config{Kind: KindAvro, Strategy: strategy})
		if err != nil {
			t.Fatal(err)
		}
		pt, err := format.NewPassthrough(reg, format.PassthroughConfig{Strategy: strategy})
		if err != nil {
			t.Fatal(err)
		}
		for _, typ := range oddTypes {
			if strategy == registry.StrategyTopicType && (typ == "." || typ == "..") {
				continue // orders-. is a subject like any other
			}
			_, err := enc.Value(t.Context(), "orders", typ, []byte(`{"a":1}`), 0)
			if !errors.Is(err, registry.ErrNotRegistered) || registry.Outage(err) || !strings.Contains(err.Error(), "type") {
				t.Errorf("schema-first, strategy %s, type %q: %v: want ErrNotRegistered (dead-lettered), naming the type", strategy, shown(typ), err)
			} else if len(err.Error()) > 2*registry.MaxErrorText {
				t.Errorf("schema-first, strategy %s, type %q: an error of %d bytes", strategy, shown(typ), len(err.Error()))
			}
			err = pt.Check(t.Context(), "orders", typ, registry.Frame(nil, 1, []byte{2}))
			if !errors.Is(err, registry.ErrSchemaUnknown) || !strings.Contains(err.Error(), "type") {
				t.Errorf("passthrough, strategy %s, type %q: %v: want ErrSchemaUnknown (dead-lettered), naming the type", strategy, shown(typ), err)
			}
		}
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("%d requests to the registry for types that cannot name a subject", n)
	}
}

// TestRegistrySchemaFirstOddTypeDeadLettered (a real Apicurio Registry):
// under the type strategy a type that no subject has, however odd, is
// ErrNotRegistered (the event dead-lettered), not an outage (the whole
// stream held for ever by one row).
func TestRegistrySchemaFirstOddTypeDeadLettered(t *testing.T) {
	r := registrytest.Start(t)
	ctx := t.Context()
	for _, strategy := range []string{registry.StrategyType, registry.StrategyTopicType} {
		enc, err := New(mustRegistry(t, registry.Config{URL: r.URL(), Timeout: 5 * time.Second}), Config{Kind: KindAvro, Strategy: strategy})
		if err != nil {
			t.Fatal(err)
		}
		for _, typ := range append([]string{"Nope", "a/b", "a?b", "a#b", "%", "a%2Fb", "a b", `a\b`, "é", "a/..", "../x", "./x", "%2e%2e", "a;b", ";", strings.Repeat("é", registry.MaxSubjectBytes/2-10)}, oddTypes...) {
			_, err := enc.Value(ctx, "orders", typ, []byte(`{"a":1}`), 0)
			switch {
			case err == nil:
				t.Errorf("strategy %s, type %q: written", strategy, shown(typ))
			case registry.Outage(err) || !errors.Is(err, registry.ErrNotRegistered):
				t.Errorf("strategy %s, type %q: %s: want ErrNotRegistered (dead-lettered), not an outage (the stream held for ever by one event's type)", strategy, shown(typ), clip(strings.ReplaceAll(err.Error(), typ, "<the type>")))
			default:
				t.Logf("strategy %s, type %q: %s", strategy, shown(typ), clip(err.Error()))
			}
		}
	}
}

// TestPingTransientIsOutage: a registry (or the proxy in front of it)
// asking walrelay to retry at start (429 Too Many Requests, Confluent's
// error_code 42901 with it; 408 Request Timeout; 425 Too Early) is an
// outage (walrelay run warns and starts), not ErrNotSchemaRegistry (run
// refuses to start, calling the URL wrong); the request is reported not
// answered (the status line), and a schema's request answered so is held.
func TestPingTransientIsOutage(t *testing.T) {
	for _, code := range []int{http.StatusTooManyRequests, http.StatusRequestTimeout, http.StatusTooEarly} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
			w.WriteHeader(code)
			w.Write([]byte(`{"error_code":42901,"message":"Request rate limit exceeded"}`))
		}))
		reg := mustRegistry(t, registry.Config{URL: srv.URL})
		var reported atomic.Pointer[error]
		reg.OnRequest(func(err error) { reported.Store(&err) })
		err := reg.Ping(t.Context())
		if err == nil || errors.Is(err, registry.ErrNotSchemaRegistry) || !registry.Outage(err) {
			t.Errorf("HTTP %d at start: %v: want an outage, not ErrNotSchemaRegistry (walrelay run refuses to start)", code, err)
		}
		if p := reported.Load(); p == nil || *p == nil || registry.NotSchemaRegistry(*p) {
			t.Errorf("HTTP %d: reported %v: want not answering", code, p)
		}
		enc, err := New(reg, Config{Kind: KindAvro})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := enc.Value(t.Context(), "orders", "OrderCreated", []byte(`{}`), 0); !registry.Outage(err) {
			t.Errorf("HTTP %d to a schema's request: %v: want an outage (held)", code, err)
		}
		srv.Close()
	}
}
