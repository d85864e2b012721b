package format

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

// TestRegistrySchemaFirstReferenceOutage (a real Apicurio Registry:
// WALRELAY_TEST_REGISTRY=1): a Protobuf schema that imports another is
// written with the referenced file read from the registry; while the
// registry fails (503) to give the referenced schema, the value is an
// outage (held and retried), not ErrNotRegistered (dead-lettered); once
// it answers, the value is written. A reference to a subject the
// registry lacks is ErrNotRegistered.
func TestRegistrySchemaFirstReferenceOutage(t *testing.T) {
	r := registrytest.Start(t)
	reg := mustRegistry(t, RegistryConfig{URL: r.URL()})
	register(t, reg.Client(), "shop-common-money", sr.Schema{Schema: "syntax = \"proto3\";\npackage shop.common;\nmessage Money { string currency = 1; int64 units = 2; }\n", Type: sr.TypeProtobuf})
	order := "syntax = \"proto3\";\npackage shop;\nimport \"shop/common/money.proto\";\nmessage OrderPaid { int64 id = 1; shop.common.Money total = 2; }\n"
	register(t, reg.Client(), "OrderPaid", sr.Schema{Schema: order, Type: sr.TypeProtobuf,
		References: []sr.SchemaReference{{Name: "shop/common/money.proto", Subject: "shop-common-money", Version: 1}}})
	target, err := url.Parse(r.Base())
	if err != nil {
		t.Fatal(err)
	}
	var failRefs atomic.Bool
	failRefs.Store(true)
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if failRefs.Load() && strings.Contains(req.URL.Path, "/subjects/shop-common-money/") {
			http.Error(w, `{"error_code": 50301, "message": "unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		rp.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	enc := schemaFirst(t, srv.URL+registrytest.CCompatPath, SchemaFirstConfig{Kind: KindProtobuf})
	payload := []byte(`{"id": "1", "total": {"currency": "EUR", "units": "5"}}`)
	_, err = enc.Value(t.Context(), "orders", "OrderPaid", payload, 0)
	if err == nil || errors.Is(err, ErrNotRegistered) || errors.Is(err, ErrMismatch) || errors.Is(err, ErrUnauthorized) {
		t.Fatalf("the referenced schema unavailable: %v, want an outage (not ErrNotRegistered, ErrMismatch, ErrUnauthorized)", err)
	}
	failRefs.Store(false)
	if _, err := enc.Value(t.Context(), "orders", "OrderPaid", payload, 0); err != nil {
		t.Fatalf("the registry answering again: %v", err)
	}

	register(t, reg.Client(), "OrderLost", sr.Schema{Schema: strings.ReplaceAll(order, "OrderPaid", "OrderLost"), Type: sr.TypeProtobuf,
		References: []sr.SchemaReference{{Name: "shop/common/money.proto", Subject: "shop-common-money", Version: 1}}})
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.Contains(req.URL.Path, "/subjects/shop-common-money/") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error_code": 40401, "message": "Subject not found"}`))
			return
		}
		rp.ServeHTTP(w, req)
	}))
	t.Cleanup(srv2.Close)
	enc2 := schemaFirst(t, srv2.URL+registrytest.CCompatPath, SchemaFirstConfig{Kind: KindProtobuf})
	if _, err := enc2.Value(t.Context(), "orders", "OrderLost", payload, 0); !errors.Is(err, ErrNotRegistered) {
		t.Errorf("a reference the registry lacks: %v, want ErrNotRegistered", err)
	}
}
