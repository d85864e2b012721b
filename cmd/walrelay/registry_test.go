package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
	"github.com/walrelay/walrelay/outbox"
	"github.com/walrelay/walrelay/sink"
)

// TestRegistryAvroStreams (a real Apicurio Registry:
// WALRELAY_TEST_REGISTRY=1): with kafka.key_format and kafka.value_format
// avro and the JSON payload expanded, every record's key and value are
// Confluent-framed Avro whose id is that of the schema registered under
// <topic>-key and <topic>-value, and decode with it to the aggregate id
// and to the payload (a JSON value, nulls and empty arrays aside, as the
// expansion leaves them out; a payload left a string decodes to its
// text); a NULL payload is a tombstone; a payload Avro cannot name is
// dead-lettered (format) and the stream goes on.
func TestRegistryAvroStreams(t *testing.T) {
	for _, exactlyOnce := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly_once=%v", exactlyOnce), func(t *testing.T) { registryAvroStreams(t, exactlyOnce) })
	}
}

// registryAvroStreams is TestRegistryAvroStreams in a mode (exactly-once:
// the dead letter inside the transaction, read committed).
func registryAvroStreams(t *testing.T, exactlyOnce bool) {
	reg := registrytest.Start(t)
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	if exactlyOnce {
		e, col = eosEnv(pg, kc), committedCollector(t, kc)
	}
	streaming(t, e.with("WALRELAY_KAFKA_KEY_FORMAT", "avro", "WALRELAY_KAFKA_VALUE_FORMAT", "avro", "WALRELAY_KAFKA_EXPAND_JSON_PAYLOAD", "true",
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", reg.URL(), "WALRELAY_KAFKA_SCHEMA_REGISTRY_AUTO_REGISTER", "true"))

	payloads := []*string{
		ptr(`{"id": 1, "name": "a", "price": 1.5, "tags": ["x", "y"], "addr": {"city": "c", "zip": null}, "big": 4294967296, "ok": true}`),
		ptr(`{"id": 2, "name": "b", "price": 2.25, "tags": [], "addr": {"city": "d"}, "ok": false}`),
		ptr(`{"lines": [{"sku": "a", "qty": 1}, {"sku": "b"}], "m": [[1, 2], [3]], "u": "é 😀"}`),
		ptr(`"just a string"`),
		ptr(`{"mixed": [1, "x"]}`), // left a string: no schema for a mixed array
		nil,
	}
	var ids []string
	want, aggs := map[string]*string{}, map[string]string{}
	for i, p := range payloads {
		id := outbox.NewID()
		if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', $2, 'T', $3)", id, fmt.Sprintf("agg-%d", i), p); err != nil {
			t.Fatal(err)
		}
		ids, want[id], aggs[id] = append(ids, id), p, fmt.Sprintf("agg-%d", i)
	}
	// Debezium fails on both (a name Avro refuses; a null among merged
	// array items, which are a required record): dead-lettered.
	bad, nullItem := outbox.NewID(), outbox.NewID()
	if _, err := conn.Exec(t.Context(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'agg-bad', 'T', '{"first-name": "x"}')`, bad); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'agg-null', 'T', '{"lines": [{"sku": "a", "qty": 1}, {"sku": "b"}, null]}')`, nullItem); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, ids, time.Minute)
	if _, err := col.Wait(t.Context(), func(rs []*kgo.Record) bool {
		n := 0
		for _, r := range rs {
			if id := string(kafkatest.Header(r, "id")); id == bad || id == nullItem {
				n++
			}
		}
		return n == 2
	}); err != nil {
		t.Fatalf("the unnamable payload and the null among merged items were not both dead-lettered: %v", err)
	}

	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	decode := func(b []byte, subject string) any {
		t.Helper()
		id, body, err := registry.Unframe(b)
		if err != nil {
			t.Fatalf("%x: %v", b, err)
		}
		s, err := cl.SchemaByID(t.Context(), int(id))
		if err != nil {
			t.Fatalf("schema %d: %v", id, err)
		}
		if latest, err := cl.SchemaByVersion(t.Context(), subject, -1); err != nil {
			t.Fatalf("subject %s: %v", subject, err)
		} else if ok, err := registered(t, cl, subject, int(id)); !ok {
			t.Fatalf("id %d is not a version of %s (latest %d): %v", id, subject, latest.ID, err)
		}
		v, err := format.DecodeAvro(s.Schema, body)
		if err != nil {
			t.Fatalf("decode with schema %d %s: %v", id, s.Schema, err)
		}
		return v
	}
	topic := kc.topic("order")
	seen := 0
	for _, r := range col.Records() {
		id := string(kafkatest.Header(r, "id"))
		if id == bad || id == nullItem {
			if r.Topic != kc.dlq() || string(kafkatest.Header(r, sink.HeaderReason)) != sink.ReasonFormat {
				t.Errorf("payload %s Debezium fails on: topic %s reason %q, want %s %s", id, r.Topic, kafkatest.Header(r, sink.HeaderReason), kc.dlq(), sink.ReasonFormat)
			}
			continue
		}
		p, ok := want[id]
		if !ok || r.Topic != topic {
			continue
		}
		seen++
		if k := decode(r.Key, topic+"-key"); k != aggs[id] {
			t.Errorf("event %s: key %v, want %s", id, k, aggs[id])
		}
		if p == nil {
			if r.Value != nil {
				t.Errorf("event %s: a NULL payload gave %x, want a tombstone", id, r.Value)
			}
			continue
		}
		got := decode(r.Value, topic+"-value")
		if !jsonEqual(got, *p) {
			g, _ := json.Marshal(got)
			t.Errorf("event %s: decoded %s, want %s", id, g, *p)
		}
	}
	if seen != len(payloads) {
		t.Fatalf("%d records of %d", seen, len(payloads))
	}
}

// registered reports whether id is one of subject's versions.
func registered(t *testing.T, cl *sr.Client, subject string, id int) (bool, error) {
	ss, err := cl.Schemas(t.Context(), subject)
	if err != nil {
		return false, err
	}
	for _, s := range ss {
		if s.ID == id {
			return true, nil
		}
	}
	return false, nil
}

// jsonEqual compares a decoded Avro value with a payload's JSON text: a
// string payload that is no JSON object or array is the text itself; in
// objects, nulls and empty arrays (which the expansion leaves out) aside.
func jsonEqual(got any, text string) bool {
	if s, ok := got.(string); ok {
		return s == text
	}
	var want any
	d := json.NewDecoder(bytes.NewReader([]byte(text)))
	d.UseNumber()
	if d.Decode(&want) != nil {
		return false
	}
	return reflect.DeepEqual(normalize(got), normalize(want))
}

// normalize drops nulls and empty arrays from objects and writes numbers
// as their shortest text.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, u := range x {
			if a, ok := u.([]any); u == nil || ok && len(a) == 0 {
				continue
			}
			out[k] = normalize(u)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, u := range x {
			out[i] = normalize(u)
		}
		return out
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return fmt.Sprint(i)
		}
		f, _ := x.Float64()
		return fmt.Sprint(f)
	case int, int32, int64, float64:
		return fmt.Sprint(x)
	}
	return v
}

// TestRegistryOutageHoldsEvents (WALRELAY_TEST_REGISTRY=1): while the
// schema registry refuses connections, events of a shape not yet
// registered are held (none published, none dead-lettered, walrelay still
// running and saying why); once it is back, every one arrives, in commit
// order, none dead-lettered.
func TestRegistryOutageHoldsEvents(t *testing.T) {
	reg := registrytest.Start(t)
	px := reg.Proxy(t)
	px.Down()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	p := streaming(t, baseEnv(pg, kc).with("WALRELAY_KAFKA_VALUE_FORMAT", "avro", "WALRELAY_KAFKA_EXPAND_JSON_PAYLOAD", "true",
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", "http://"+px.Addr()+registrytest.CCompatPath, "WALRELAY_KAFKA_SCHEMA_REGISTRY_AUTO_REGISTER", "true",
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_TIMEOUT", "2s"))
	var ids []string
	for i := range 6 {
		id := outbox.NewID()
		if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'one', 'T', $2)", id, fmt.Sprintf(`{"n": %d}`, i)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	p.waitLog("schema registry", 30*time.Second)
	time.Sleep(2 * time.Second)
	if n := len(col.Records()); n != 0 {
		t.Fatalf("%d records published or dead-lettered while the registry was down", n)
	}
	px.Up()
	up := time.Now()
	waitAll(t, col, ids, time.Minute)
	t.Logf("all arrived %s after the registry came back", time.Since(up).Round(time.Millisecond))
	var got []string
	for _, r := range inLogOrder(col.Records()) {
		if r.Topic == kc.dlq() {
			t.Fatalf("dead-lettered: %s", kafkatest.Header(r, sink.HeaderReason))
		}
		id := string(kafkatest.Header(r, "id"))
		if len(got) == 0 || got[len(got)-1] != id {
			got = append(got, id) // a resend of the last one aside
		}
	}
	if !slices.Equal(dedupe(got), ids) {
		t.Fatalf("order %v, want %v", got, ids)
	}
}

// dedupe keeps each id's first place.
func dedupe(ids []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// TestRegistryCheck (WALRELAY_TEST_REGISTRY=1): walrelay check with the
// avro format says whether the schema registry answers; a registry that
// does not fails the check (exit 1), its password never printed.
func TestRegistryCheck(t *testing.T) {
	reg := registrytest.Start(t)
	pg, kc, _ := setup(t)
	e := baseEnv(pg, kc).with("WALRELAY_KAFKA_VALUE_FORMAT", "avro", "WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", reg.URL())
	if code, out := runCmd(t, e, "check"); code != 0 || !strings.Contains(out, "OK    schema registry") {
		t.Fatalf("check with the registry up: exit %d\n%s", code, out)
	}
	px := reg.Proxy(t)
	px.Down()
	e = e.with("WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", "http://"+px.Addr()+registrytest.CCompatPath,
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_USERNAME", "relay", "WALRELAY_KAFKA_SCHEMA_REGISTRY_PASSWORD", "pw-not-shown")
	code, out := runCmd(t, e, "check")
	if code == 0 || !strings.Contains(out, "FAIL  schema registry") || strings.Contains(out, "pw-not-shown") {
		t.Fatalf("check with the registry down: exit %d\n%s", code, out)
	}
}

// TestRegistryRefusedCredentialsStop: a schema registry that refuses
// walrelay's credentials (401) stops walrelay with an error that names the
// keys to fix, the password never printed, and nothing published or
// dead-lettered (a registry of its own that answers 401: no real one
// needed).
func TestRegistryRefusedCredentialsStop(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error_code":401,"message":"Unauthorized"}`))
	}))
	t.Cleanup(srv.Close)
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	p := start(t, baseEnv(pg, kc).with("WALRELAY_KAFKA_VALUE_FORMAT", "avro", "WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", srv.URL,
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_USERNAME", "relay", "WALRELAY_KAFKA_SCHEMA_REGISTRY_PASSWORD", "pw-not-shown"), "run")
	p.waitLog("streaming", 30*time.Second)
	if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'one', 'T', '{}')", outbox.NewID()); err != nil {
		t.Fatal(err)
	}
	if code := p.exit(30 * time.Second); code == 0 || !strings.Contains(p.out.String(), "fix kafka.schema_registry.username and its password") || strings.Contains(p.out.String(), "pw-not-shown") {
		t.Fatalf("exit %d:\n%s", code, p.out.String())
	}
	if n := len(col.Records()); n != 0 {
		t.Fatalf("%d records published or dead-lettered", n)
	}
}

// TestRegistrySchemaNotRegistered (WALRELAY_TEST_REGISTRY=1): without
// auto-registration, an event whose schema its subject lacks is
// dead-lettered (schema_refused, the subject named) and the stream goes
// on; one whose schema is registered is published with its id.
func TestRegistrySchemaNotRegistered(t *testing.T) {
	reg := registrytest.Start(t)
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	// The schema of {"a": 1}, registered beforehand under the topic's
	// subject.
	schema := `{"type":"record","name":"payload","fields":[{"name":"a","type":["null","int"],"default":null}],"connect.name":"payload"}`
	id, err := cl.RegisterSchema(t.Context(), kc.topic("order")+"-value", sr.Schema{Schema: schema, Type: sr.TypeAvro}, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	streaming(t, baseEnv(pg, kc).with("WALRELAY_KAFKA_VALUE_FORMAT", "avro", "WALRELAY_KAFKA_EXPAND_JSON_PAYLOAD", "true",
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", reg.URL()))
	unknown, known := outbox.NewID(), outbox.NewID()
	for id, p := range map[string]string{unknown: `{"b": "x"}`, known: `{"a": 1}`} {
		if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'one', 'T', $2)", id, p); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, col, []string{known}, time.Minute)
	if _, err := col.Wait(t.Context(), func(rs []*kgo.Record) bool {
		for _, r := range rs {
			if string(kafkatest.Header(r, "id")) == unknown {
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatal(err)
	}
	for _, r := range col.Records() {
		switch string(kafkatest.Header(r, "id")) {
		case unknown:
			if r.Topic != kc.dlq() || string(kafkatest.Header(r, sink.HeaderReason)) != sink.ReasonSchemaRefused || !strings.Contains(string(kafkatest.Header(r, sink.HeaderError)), kc.topic("order")+"-value") {
				t.Errorf("unregistered: topic %s, reason %q, error %q", r.Topic, kafkatest.Header(r, sink.HeaderReason), kafkatest.Header(r, sink.HeaderError))
			}
		case known:
			if got, _, err := registry.Unframe(r.Value); err != nil || int(got) != id || r.Topic != kc.topic("order") {
				t.Errorf("registered: topic %s, id %d %v, want %d", r.Topic, got, err, id)
			}
		}
	}
}
