package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/registrytest"
	"github.com/walrelay/walrelay/outbox"
)

// TestRegistryOutageStatus (WALRELAY_TEST_REGISTRY=1): what the operator
// sees while the schema registry does not answer, as for Kafka: walrelay
// status says "schema registry NOT ANSWERING" and what is held, the log
// says so once when it happens and once when it answers again, and
// walrelay_schema_registry_requests_total counts the failed requests; the
// registry's password is printed nowhere.
func TestRegistryOutageStatus(t *testing.T) {
	reg := registrytest.Start(t)
	px := reg.Proxy(t)
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	addr := freeAddr(t)
	e := baseEnv(pg, kc).with("WALRELAY_KAFKA_VALUE_FORMAT", "avro", "WALRELAY_KAFKA_EXPAND_JSON_PAYLOAD", "true",
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", "http://"+px.Addr()+registrytest.CCompatPath, "WALRELAY_KAFKA_SCHEMA_REGISTRY_AUTO_REGISTER", "true",
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_USERNAME", "relay", "WALRELAY_KAFKA_SCHEMA_REGISTRY_PASSWORD", "pw-not-shown",
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_TIMEOUT", "2s", "WALRELAY_ADMIN_LISTEN", addr)
	p := streaming(t, e)
	insert := func(payload string) string {
		id := outbox.NewID()
		if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'one', 'T', $2)", id, payload); err != nil {
			t.Fatal(err)
		}
		return id
	}
	first := insert(`{"a": 1}`)
	waitAll(t, col, []string{first}, time.Minute)
	if code, status := runCmd(t, e, "status"); code != 0 || !regexp.MustCompile(`schema registry\s+answering`).MatchString(status) {
		t.Fatalf("walrelay status with the registry up (exit %d):\n%s", code, status)
	}

	px.Down()
	held := insert(`{"b": "a shape not seen yet"}`)
	p.waitLog(`msg="the schema registry is not answering`, 30*time.Second)
	code, status := runCmd(t, e, "status")
	t.Logf("walrelay status during the outage:\n%s", status)
	if code != 0 || !regexp.MustCompile(`schema registry\s+NOT ANSWERING since`).MatchString(status) || !strings.Contains(status, "events held until it answers") {
		t.Fatalf("walrelay status during a registry outage (exit %d) does not say so:\n%s", code, status)
	}
	metrics := httpGet(t, "http://"+addr+"/metrics")
	if v, ok := metricValue(metrics, `walrelay_schema_registry_requests_total{outcome="error"}`); !ok || v < 1 {
		t.Errorf("walrelay_schema_registry_requests_total{outcome=\"error\"} = %v %v during the outage", v, ok)
	}
	if v, ok := metricValue(metrics, `walrelay_schema_registry_requests_total{outcome="ok"}`); !ok || v < 1 {
		t.Errorf("walrelay_schema_registry_requests_total{outcome=\"ok\"} = %v %v", v, ok)
	}

	px.Up()
	waitAll(t, col, []string{held}, time.Minute)
	p.waitLog(`msg="the schema registry answers again"`, 30*time.Second)
	if code, status := runCmd(t, e, "status"); code != 0 || strings.Contains(status, "NOT ANSWERING") {
		t.Fatalf("walrelay status after the outage (exit %d):\n%s", code, status)
	}
	out := p.out.String()
	if n := strings.Count(out, "the schema registry is not answering"); n != 1 {
		t.Errorf("%d lines say the registry is not answering, want 1", n)
	}
	if strings.Contains(out+status+metrics, "pw-not-shown") {
		t.Error("the registry's password is printed")
	}
}
