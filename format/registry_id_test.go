package format

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
	reg := mustRegistry(t, RegistryConfig{URL: r.URL(), Timeout: 10 * time.Second})
	p, err := NewPassthrough(reg, PassthroughConfig{Strategy: StrategyAny})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range beyondInt32 {
		err := p.Check(t.Context(), "orders", "OrderCreated", Frame(nil, id, []byte{2}))
		if !errors.Is(err, ErrSchemaUnknown) || Outage(err) {
			t.Errorf("a payload framed with schema id %d: %v (outage %v); want ErrSchemaUnknown (dead-lettered), not the stream held for ever", id, clip(err.Error()), Outage(err))
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
	reg := mustRegistry(t, RegistryConfig{URL: srv.URL})
	for _, strategy := range []string{StrategyAny, StrategyTopic} {
		p := mustPassthrough(t, reg, PassthroughConfig{Strategy: strategy})
		for _, id := range beyondInt32 {
			if err := p.Check(t.Context(), "orders", "OrderCreated", Frame(nil, id, []byte{2})); !errors.Is(err, ErrSchemaUnknown) || Outage(err) {
				t.Errorf("strategy %s, id %d: %v (outage %v), want ErrSchemaUnknown", strategy, id, err, Outage(err))
			}
		}
	}
	for _, id := range beyondInt32 {
		if _, err := reg.SchemaByID(t.Context(), id); !errors.Is(err, ErrSchemaUnknown) {
			t.Errorf("SchemaByID(%d): %v, want ErrSchemaUnknown", id, err)
		}
		if err := reg.inSubject(t.Context(), id, "orders-value"); !errors.Is(err, ErrSchemaUnknown) {
			t.Errorf("inSubject(%d): %v, want ErrSchemaUnknown", id, err)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("%d requests to the registry for ids beyond int32, want none", n)
	}
}

// TestCheckRegistryURLRefusesQueryOrFragment: a token in the registry
// URL's query (?access_token=...) or fragment passed CheckRegistryURL,
// franz-go kept the query on every request, and its errors printed the URL
// whole: `unable to GET "http://127.0.0.1:1/subjects?access_token=..."`
// (review44's TestProbe44RegistryURLTokenInQuery). A query or fragment,
// even an empty one, is refused (ErrRegistryURLQuery) without printing
// it; a path, which a token in it cannot be told from, passes.
func TestCheckRegistryURLRefusesQueryOrFragment(t *testing.T) {
	for _, u := range []string{
		"http://127.0.0.1:1/?access_token=s3cret-pw",
		"http://127.0.0.1:1?access_token=s3cret-pw",
		"https://registry/apis/ccompat/v7?token=s3cret-pw",
		"http://registry:8081/#s3cret-pw",
		"http://registry:8081#access_token=s3cret-pw",
		"http://registry:8081/?",
		"http://registry:8081/#",
	} {
		if err := CheckRegistryURL(u); !errors.Is(err, ErrRegistryURLQuery) {
			t.Errorf("CheckRegistryURL(%q): %v, want ErrRegistryURLQuery", u, err)
		}
		reg, err := NewRegistry(RegistryConfig{URL: u})
		if err == nil {
			err = reg.Ping(t.Context())
			t.Errorf("NewRegistry(%q) taken (a ping: %v), want a refusal", u, err)
			continue
		}
		if !errors.Is(err, ErrRegistryURLQuery) || strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("NewRegistry(%q): %v, want ErrRegistryURLQuery, not printing the URL", u, err)
		}
	}
	for _, u := range []string{"http://registry:8081/t/s3cret-pw/", "http://registry:8081/apis/ccompat/v7/"} {
		if err := CheckRegistryURL(u); err != nil {
			t.Errorf("CheckRegistryURL(%q): %v, want a path taken", u, err)
		}
	}
}

// TestCheckRegistryURL: a registry URL is http or https with a host and
// no credentials; NewRegistry refuses any other without printing it (a
// host:port with credentials and no scheme parses as the scheme "user",
// which franz-go took and printed, password and all).
func TestCheckRegistryURL(t *testing.T) {
	for _, c := range []struct {
		url  string
		want error
	}{
		{"http://registry:8081", nil},
		{"https://registry/apis/ccompat/v7", nil},
		{"http://[::1]:8081", nil},
		{"user:s3cret-pw@127.0.0.1:1", ErrRegistryURL},
		{"http:/user:s3cret-pw@127.0.0.1:1", ErrRegistryURL},
		{"http:user:s3cret-pw@127.0.0.1:1", ErrRegistryURL},
		{"registry:8081", ErrRegistryURL},
		{"ftp://registry", ErrRegistryURL},
		{"http://", ErrRegistryURL},
		{"http://u:s3cret-pw@registry:8081/%zz", ErrRegistryURL},
		{"http://u:s3cret-pw@registry:8081", ErrRegistryURLCredentials},
		{"https://s3cret-pw@registry", ErrRegistryURLCredentials},
		{"//s3cret-pw@registry", ErrRegistryURLCredentials},
	} {
		err := CheckRegistryURL(c.url)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("CheckRegistryURL(%q): %v, want %v", c.url, err, c.want)
		}
		if c.want == nil {
			continue
		}
		if _, err := NewRegistry(RegistryConfig{URL: c.url}); err == nil || strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("NewRegistry(%q): %v, want a refusal that does not print the URL", c.url, err)
		}
	}
}
