package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
	"github.com/walrelay/walrelay/outbox"
	"github.com/walrelay/walrelay/sink"
)

// A schema-first case: the schema registered (under subject), the
// format's settings, rows that fit (good) and rows that do not (bad, with
// the field each names), and an independent decoder of the records.
type schemaFirstCase struct {
	format, subject, typ string
	schema               sr.Schema
	env                  []string
	good                 []string
	bad                  map[string]string // payload -> the field its dead letter names
	// decode decodes a record's body (after the 5-byte framing), read
	// with the registry's schema of id, to JSON.
	decode func(t *testing.T, cl *sr.Client, id int, body []byte) string
}

// TestRegistrySchemaFirstStreams (a real Apicurio Registry:
// WALRELAY_TEST_REGISTRY=1): with kafka.value_format registered_avro
// (subjects by event type), registered_protobuf (by topic and type, a
// nested message) and registered_jsonschema (a fixed subject and
// version), each JSON payload that fits the schema registered in the
// registry is published framed with that schema's id and decodes, by a
// path of the test's own (hamba's generic Avro decoding, the .proto
// compiled afresh with protocompile and read with dynamicpb after
// Confluent's message indexes, the JSON itself), to the payload; each
// payload that does not fit is dead-lettered (schema_mismatch), its error
// naming the field, and nothing of it reaches the topic; walrelay
// registers no schema (a schema file named in
// kafka.schema_registry.subjects included, auto_register being false).
func TestRegistrySchemaFirstStreams(t *testing.T) {
	reg := registrytest.Start(t)
	// A schema file named, and auto_register false (the default): walrelay
	// registers nothing still.
	unregistered := schemaFile(t, t.TempDir(), "never.avsc", `{"type":"record","name":"Never","fields":[{"name":"x","type":"long"}]}`)
	cases := []schemaFirstCase{{
		format: "registered_avro", subject: "OrderCreated", typ: "OrderCreated",
		env: []string{"WALRELAY_KAFKA_SCHEMA_REGISTRY_SUBJECTS", "OrderCreated,NeverRegistered=" + unregistered},
		schema: sr.Schema{Type: sr.TypeAvro, Schema: `{"type":"record","name":"OrderCreated","namespace":"shop","fields":[
			{"name":"id","type":"long"},{"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID"]}},
			{"name":"lines","type":{"type":"array","items":{"type":"record","name":"Line","fields":[{"name":"sku","type":"string"},{"name":"qty","type":"int","default":1}]}}},
			{"name":"note","type":["null","string"],"default":null}]}`},
		good: []string{`{"id": 4294967296, "status": "PAID", "lines": [{"sku": "a", "qty": 2}], "note": "gift"}`, `{"id": 2, "status": "NEW", "lines": []}`},
		bad:  map[string]string{`{"id": 3, "lines": []}`: "/status", `{"id": 4, "status": "NEW", "lines": [{"qty": 1}]}`: "/lines/0/sku", `{"id": "x", "status": "NEW", "lines": []}`: "/id"},
		decode: func(t *testing.T, cl *sr.Client, id int, body []byte) string {
			s, err := cl.SchemaByID(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			var v map[string]any
			if err := avro.Unmarshal(avro.MustParse(s.Schema), body, &v); err != nil {
				t.Fatalf("avro: %v", err)
			}
			if v["note"] == nil {
				delete(v, "note")
			}
			b, _ := json.Marshal(v)
			return string(b)
		},
	}, {
		format: "registered_protobuf", typ: "Shipped",
		env: []string{"WALRELAY_KAFKA_SCHEMA_REGISTRY_SUBJECT_STRATEGY", "topic_type", "WALRELAY_KAFKA_SCHEMA_REGISTRY_MESSAGE", "shop.Envelope.Shipped"},
		schema: sr.Schema{Type: sr.TypeProtobuf, Schema: `syntax = "proto3";
package shop;
message Other { string x = 1; }
message Envelope {
  message Shipped { int64 id = 1; string carrier = 2; repeated string parcels = 3; }
}
`},
		good: []string{`{"id": "4294967296", "carrier": "ups", "parcels": ["p1", "p2"]}`, `{"id": "5"}`},
		bad:  map[string]string{`{"id": "6", "colour": "red"}`: "/colour", `{"id": "7", "carrier": 3}`: "/carrier"},
		decode: func(t *testing.T, cl *sr.Client, id int, body []byte) string {
			var h sr.ConfluentHeader
			index, msg, err := h.DecodeIndex(body, 10)
			if err != nil || fmt.Sprint(index) != "[1 0]" {
				t.Fatalf("message indexes %v %v, want [1 0] (Envelope.Shipped)", index, err)
			}
			s, err := cl.SchemaByID(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			files, err := (&protocompile.Compiler{Resolver: &protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(map[string]string{"a.proto": s.Schema})}}).Compile(context.Background(), "a.proto")
			if err != nil {
				t.Fatal(err)
			}
			md := files[0].Messages().Get(index[0]).Messages().Get(index[1])
			m := dynamicpb.NewMessage(md)
			if err := proto.Unmarshal(msg, m); err != nil {
				t.Fatal(err)
			}
			b, _ := protojson.Marshal(m)
			return string(b)
		},
	}, {
		format: "registered_jsonschema", subject: "shipments-v", typ: "Any",
		env:    []string{"WALRELAY_KAFKA_SCHEMA_REGISTRY_SUBJECT_STRATEGY", "subject", "WALRELAY_KAFKA_SCHEMA_REGISTRY_SUBJECT", "shipments-v", "WALRELAY_KAFKA_SCHEMA_REGISTRY_VERSION", "1"},
		schema: sr.Schema{Type: sr.TypeJSON, Schema: `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"id":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["id"],"additionalProperties":false}`},
		good:   []string{`{"id": 1, "tags": ["a"]}`, `{"id": 2}`},
		bad:    map[string]string{`{"id": 3, "tags": ["a", 4]}`: "/tags/1", `{"id": 1.5}`: "/id"},
		decode: func(t *testing.T, cl *sr.Client, id int, body []byte) string { return string(body) },
	}}
	for _, c := range cases {
		t.Run(c.format, func(t *testing.T) { schemaFirstStreams(t, reg, c, false) })
	}
	// Exactly-once: the dead letters in the transactions, read committed.
	t.Run("registered_avro_exactly_once", func(t *testing.T) { schemaFirstStreams(t, reg, cases[0], true) })
}

func schemaFirstStreams(t *testing.T, reg *registrytest.Registry, c schemaFirstCase, exactlyOnce bool) {
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	if exactlyOnce {
		e, col = eosEnv(pg, kc), committedCollector(t, kc)
	}
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	topic := kc.topic("order")
	subject := c.subject
	if subject == "" {
		subject = topic + "-" + c.typ
	}
	ss, err := cl.CreateSchema(t.Context(), subject, c.schema)
	if err != nil {
		t.Fatalf("register %s: %v", subject, err)
	}
	if c.format == "registered_jsonschema" {
		// Version 2, which the fixed version 1 must not use: it would
		// refuse every payload.
		if _, err := cl.CreateSchema(t.Context(), subject, sr.Schema{Type: sr.TypeJSON, Schema: `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","required":["never"]}`}); err != nil {
			t.Fatal(err)
		}
	}
	subjectsBefore, _ := cl.Subjects(t.Context())
	streaming(t, e.with(append([]string{"WALRELAY_KAFKA_VALUE_FORMAT", c.format, "WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", reg.URL()}, c.env...)...))

	var all []string
	want := map[string]string{}
	insert := func(p string) string {
		id := outbox.NewID()
		if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'agg', $2, $3)", id, c.typ, p); err != nil {
			t.Fatal(err)
		}
		all = append(all, id)
		want[id] = p
		return id
	}
	good := map[string]bool{}
	for _, p := range c.good {
		good[insert(p)] = true
	}
	fields := map[string]string{}
	for p, field := range c.bad {
		fields[insert(p)] = field
	}
	// Good ones to the topic, bad ones to the dead-letter topic.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := col.Wait(ctx, func(rs []*kgo.Record) bool {
		n := 0
		for _, r := range rs {
			if _, ok := want[string(kafkatest.Header(r, "id"))]; ok {
				n++
			}
		}
		return n >= len(all)
	}); err != nil {
		t.Fatalf("not every event arrived: %v", err)
	}

	seen := 0
	for _, r := range col.Records() {
		id := sink.Header(r, "id")
		if _, ok := want[id]; !ok {
			continue
		}
		seen++
		if field, bad := fields[id]; bad {
			errText := string(kafkatest.Header(r, sink.HeaderError))
			if r.Topic != kc.dlq() || string(kafkatest.Header(r, sink.HeaderReason)) != sink.ReasonSchemaMismatch || !strings.Contains(errText, "field "+field+":") {
				t.Errorf("%s: topic %s reason %q error %q, want %s %s naming %s", want[id], r.Topic, kafkatest.Header(r, sink.HeaderReason), errText, kc.dlq(), sink.ReasonSchemaMismatch, field)
			}
			continue
		}
		if r.Topic != topic {
			t.Errorf("%s: topic %s, want %s", want[id], r.Topic, topic)
			continue
		}
		if len(r.Value) < 5 || r.Value[0] != 0 {
			t.Fatalf("%s: % x is not Confluent-framed", want[id], r.Value)
		}
		sid := int(r.Value[1])<<24 | int(r.Value[2])<<16 | int(r.Value[3])<<8 | int(r.Value[4])
		if sid != ss.ID {
			t.Errorf("%s: schema id %d, want %d (%s version %d)", want[id], sid, ss.ID, subject, ss.Version)
		}
		got := c.decode(t, cl, sid, r.Value[5:])
		if !jsonEqual(jsonValue(t, got), want[id]) {
			t.Errorf("decoded %s, want %s", got, want[id])
		}
	}
	if seen != len(all) {
		t.Errorf("%d of %d events seen", seen, len(all))
	}
	if subjects, _ := cl.Subjects(t.Context()); len(subjects) != len(subjectsBefore) {
		t.Errorf("subjects %v, were %v: walrelay registered a schema", subjects, subjectsBefore)
	}
}

// jsonValue parses JSON text with numbers as json.Number.
func jsonValue(t *testing.T, text string) any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("%s: %v", text, err)
	}
	return v
}

// TestRegistrySchemaFirstCheck (WALRELAY_TEST_REGISTRY=1): walrelay check
// with a schema-first format prints a line per configured subject: ok with
// its version and id when it exists with a schema of the format's kind,
// FAIL (exit 1) when it does not exist or holds another kind, and a
// warning when the strategy names subjects by type and none is listed.
func TestRegistrySchemaFirstCheck(t *testing.T) {
	reg := registrytest.Start(t)
	pg, kc, _ := setup(t)
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := cl.CreateSchema(t.Context(), "OrderCreated", sr.Schema{Type: sr.TypeProtobuf, Schema: `syntax = "proto3"; message OrderCreated { int64 id = 1; }`})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CreateSchema(t.Context(), "Avroish", sr.Schema{Type: sr.TypeAvro, Schema: `"string"`}); err != nil {
		t.Fatal(err)
	}
	e := baseEnv(pg, kc).with("WALRELAY_KAFKA_VALUE_FORMAT", "registered_protobuf", "WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", reg.URL())
	code, out := runCmd(t, e, "check")
	if code != 0 || !strings.Contains(out, "OK    schema registry") || !strings.Contains(out, "kafka.schema_registry.subjects") {
		t.Fatalf("check without subjects: exit %d\n%s", code, out)
	}
	code, out = runCmd(t, e.with("WALRELAY_KAFKA_SCHEMA_REGISTRY_SUBJECTS", "OrderCreated"), "check")
	if l := subjectCheckLine(out, "schema subject OrderCreated"); code != 0 || !strings.HasPrefix(l, "OK") || !strings.Contains(l, fmt.Sprintf("version 1, id %d", ss.ID)) {
		t.Fatalf("check with a registered subject: exit %d\n%s", code, out)
	}
	code, out = runCmd(t, e.with("WALRELAY_KAFKA_SCHEMA_REGISTRY_SUBJECTS", "OrderCreated,OrderPaid,Avroish"), "check")
	if code == 0 || !strings.HasPrefix(subjectCheckLine(out, "schema subject OrderPaid"), "FAIL") || !strings.HasPrefix(subjectCheckLine(out, "schema subject Avroish"), "FAIL") || !strings.HasPrefix(subjectCheckLine(out, "schema subject OrderCreated"), "OK") {
		t.Fatalf("check with a missing subject and one of another kind: exit %d\n%s", code, out)
	}
}

// subjectCheckLine is the line of walrelay check's output about check (a name of several words), "" if none.
func subjectCheckLine(out, check string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, check+" ") {
			return l
		}
	}
	return ""
}

// TestRegistrySchemaFirstOutageHoldsEvents (WALRELAY_TEST_REGISTRY=1):
// while the schema registry refuses connections, schema-first events are
// held, those that will not fit their schema too (none published, none
// dead-lettered: without the schema nothing can be judged); once it is
// back, the ones that fit arrive in commit order and the one that does not
// is dead-lettered (schema_mismatch).
func TestRegistrySchemaFirstOutageHoldsEvents(t *testing.T) {
	reg := registrytest.Start(t)
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CreateSchema(t.Context(), "Tick", sr.Schema{Type: sr.TypeProtobuf, Schema: `syntax = "proto3"; message Tick { int32 n = 1; }`}); err != nil {
		t.Fatal(err)
	}
	px := reg.Proxy(t)
	px.Down()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	p := streaming(t, baseEnv(pg, kc).with("WALRELAY_KAFKA_VALUE_FORMAT", "registered_protobuf",
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", "http://"+px.Addr()+registrytest.CCompatPath, "WALRELAY_KAFKA_SCHEMA_REGISTRY_TIMEOUT", "2s"))
	var ids []string
	insert := func(payload string) string {
		id := outbox.NewID()
		if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'one', 'Tick', $2)", id, payload); err != nil {
			t.Fatal(err)
		}
		return id
	}
	for i := range 3 {
		ids = append(ids, insert(fmt.Sprintf(`{"n": %d}`, i)))
	}
	bad := insert(`{"n": "x"}`)
	ids = append(ids, insert(`{"n": 3}`))
	p.waitLog("schema registry", 30*time.Second)
	time.Sleep(2 * time.Second)
	if n := len(col.Records()); n != 0 {
		t.Fatalf("%d records published or dead-lettered while the registry was down", n)
	}
	px.Up()
	waitAll(t, col, ids, time.Minute)
	var got []string
	deadLettered := false
	for _, r := range inLogOrder(col.Records()) {
		id := sink.Header(r, "id")
		if len(got) == 0 || got[len(got)-1] != id {
			got = append(got, id)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := col.Wait(ctx, func(rs []*kgo.Record) bool {
		for _, r := range rs {
			if sink.Header(r, "id") == bad && r.Topic == kc.dlq() && sink.Header(r, sink.HeaderReason) == sink.ReasonSchemaMismatch {
				deadLettered = true
			}
		}
		return deadLettered
	}); err != nil {
		t.Errorf("the payload that does not fit was not dead-lettered (schema_mismatch): %v", err)
	}
	if !slices.Equal(dedupe(got), ids) {
		t.Fatalf("order %v, want %v", got, ids)
	}
}
