package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
	"github.com/walrelay/walrelay/outbox"
	"github.com/walrelay/walrelay/sink"
)

// TestRegistryWrongURL (WALRELAY_TEST_REGISTRY=1): a schema registry URL
// that misses Confluent's API (Apicurio's base URL, without
// /apis/ccompat/v7: every request answers 404 with error code 404, not
// Confluent's 40401/40402/40403) stops walrelay run at start, the error
// naming kafka.schema_registry.url and the path, nothing published or
// dead-lettered. A URL that stops serving the API later (a proxy in front
// of the registry reconfigured) holds the events, never dead-letters
// them, and walrelay status and the log call it a configuration problem;
// once the API answers again they are published.
func TestRegistryWrongURL(t *testing.T) {
	reg := registrytest.Start(t)
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	shapes := 0
	insert := func() string { // each of a shape not seen yet: a request to the registry
		shapes++
		id := outbox.NewID()
		if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'one', 'T', $2)", id, fmt.Sprintf(`{"shape_%d": 1}`, shapes)); err != nil {
			t.Fatal(err)
		}
		return id
	}
	e := baseEnv(pg, kc).with("WALRELAY_KAFKA_VALUE_FORMAT", "avro", "WALRELAY_KAFKA_EXPAND_JSON_PAYLOAD", "true",
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_AUTO_REGISTER", "true", "WALRELAY_KAFKA_SCHEMA_REGISTRY_TIMEOUT", "2s")
	p := start(t, e.with("WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", reg.Base()), "run")
	if code := p.exit(30 * time.Second); code == 0 || !strings.Contains(p.out.String(), "kafka.schema_registry.url") || !strings.Contains(p.out.String(), "/apis/ccompat/v7") {
		t.Fatalf("walrelay run with the registry's base URL: exit %d, want it to refuse to start naming kafka.schema_registry.url and /apis/ccompat/v7:\n%s", code, p.out.String())
	}

	// A proxy that answers as a server without the API while wrong is set.
	target, err := url.Parse(reg.Base())
	if err != nil {
		t.Fatal(err)
	}
	var wrong atomic.Bool
	rp := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if wrong.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"message":"RESTEASY003210: Could not find resource for full path: %s","error_code":404}`, r.URL.Path)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	addr := freeAddr(t)
	e = e.with("WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", front.URL+registrytest.CCompatPath, "WALRELAY_ADMIN_LISTEN", addr)
	p = streaming(t, e)
	first := insert()
	waitAll(t, col, []string{first}, time.Minute)
	wrong.Store(true)
	held := insert()
	p.waitLog("the schema registry URL does not serve Confluent's Schema Registry API: a configuration problem", 30*time.Second)
	code, status := runCmd(t, e, "status")
	t.Logf("walrelay status while the URL is wrong:\n%s", status)
	if code != 0 || !regexp.MustCompile(`schema registry\s+WRONG URL`).MatchString(status) || !strings.Contains(status, "kafka.schema_registry.url") {
		t.Errorf("walrelay status while the URL does not serve the API (exit %d) does not say so:\n%s", code, status)
	}
	for _, r := range col.Records() {
		if r.Topic == kc.dlq() {
			t.Fatalf("dead-lettered while the URL was wrong: %s: %s", kafkatest.Header(r, sink.HeaderReason), kafkatest.Header(r, "walrelay.error"))
		}
	}
	wrong.Store(false)
	waitAll(t, col, []string{first, held}, time.Minute)
}
