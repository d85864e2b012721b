package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
	"github.com/walrelay/walrelay/outbox"
	"github.com/walrelay/walrelay/sink"
)

// TestRegistryPassthroughStreams (a real Apicurio Registry:
// WALRELAY_TEST_REGISTRY=1): with kafka.value_format registry_passthrough
// and a bytea payload that the application serialized in Avro and framed
// with its schema's id (Debezium's Avro recipe), the record's value is the
// payload, byte for byte; a payload framed with an id the registry does
// not have is dead-lettered (schema_unknown), one framed with the id of
// another topic's subject too (schema_unknown, naming both subjects), one
// not framed (format), and the stream goes on.
func TestRegistryPassthroughStreams(t *testing.T) {
	reg := registrytest.Start(t)
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	execSQL(t, conn, "ALTER TABLE outbox ALTER COLUMN payload TYPE bytea USING convert_to(payload::text, 'UTF8')")
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	schema := `{"type":"record","name":"Order","fields":[{"name":"id","type":"long"},{"name":"note","type":"string"}]}`
	id, err := cl.RegisterSchema(t.Context(), kc.topic("order")+"-value", sr.Schema{Schema: schema, Type: sr.TypeAvro}, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	payment := `{"type":"record","name":"Payment","fields":[{"name":"amount","type":"long"}]}`
	paymentID, err := cl.RegisterSchema(t.Context(), "payments-value", sr.Schema{Schema: payment, Type: sr.TypeAvro}, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	body, err := avro.Marshal(avro.MustParse(schema), map[string]any{"id": int64(7), "note": "é\x00"})
	if err != nil {
		t.Fatal(err)
	}
	streaming(t, baseEnv(pg, kc).with("WALRELAY_KAFKA_VALUE_FORMAT", "registry_passthrough", "WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", reg.URL()))

	good, unknown, foreign, unframed, after := outbox.NewID(), outbox.NewID(), outbox.NewID(), outbox.NewID(), outbox.NewID()
	payloads := map[string][]byte{
		good:     registry.Frame(nil, uint32(id), body),
		unknown:  registry.Frame(nil, uint32(id)+1000, body),
		foreign:  registry.Frame(nil, uint32(paymentID), []byte{14}),
		unframed: []byte(`{"id": 7}`),
		after:    registry.Frame(nil, uint32(id), body),
	}
	for _, e := range []string{good, unknown, foreign, unframed, after} {
		if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'o-7', 'T', $2)", e, payloads[e]); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, col, []string{good, after}, time.Minute)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := col.Wait(ctx, func(rs []*kgo.Record) bool {
		n := 0
		for _, r := range rs {
			if id := string(kafkatest.Header(r, "id")); id == unknown || id == foreign || id == unframed {
				n++
			}
		}
		return n == 3
	}); err != nil {
		t.Fatalf("the dead letters: %v", err)
	}
	seen := 0
	for _, r := range col.Records() {
		e := string(kafkatest.Header(r, "id"))
		reason, why := string(kafkatest.Header(r, sink.HeaderReason)), string(kafkatest.Header(r, sink.HeaderError))
		switch e {
		case good, after:
			if r.Topic != kc.topic("order") || !bytes.Equal(r.Value, payloads[e]) || string(r.Key) != "o-7" {
				t.Errorf("%s: topic %s, key %q, value %x, want %x untouched", e, r.Topic, r.Key, r.Value, payloads[e])
			}
		case unknown:
			if r.Topic != kc.dlq() || reason != sink.ReasonSchemaUnknown || !strings.Contains(why, "schema id") {
				t.Errorf("unknown id: topic %s, reason %q, error %q", r.Topic, reason, why)
			}
		case foreign:
			want := "in subject " + kc.topic("order") + "-value: it is payments-value version 1"
			if r.Topic != kc.dlq() || reason != sink.ReasonSchemaUnknown || !strings.Contains(why, want) {
				t.Errorf("another subject's id: topic %s, reason %q, error %q, want %q", r.Topic, reason, why, want)
			}
		case unframed:
			if r.Topic != kc.dlq() || reason != sink.ReasonFormat || !strings.Contains(why, "wire format") {
				t.Errorf("unframed: topic %s, reason %q, error %q", r.Topic, reason, why)
			}
		default:
			continue
		}
		seen++
	}
	if seen != 5 {
		t.Errorf("%d records, want 5", seen)
	}
}
