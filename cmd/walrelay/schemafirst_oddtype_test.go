package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
	"github.com/walrelay/walrelay/outbox"
	"github.com/walrelay/walrelay/sink"
)

// TestRegistrySchemaFirstOddTypeDeadLettered (WALRELAY_TEST_REGISTRY=1):
// under the type strategy an event whose type cannot name a subject ("..",
// which the request's URL loses: /subjects/../versions/latest is
// /versions/latest, a 404 without Confluent's error code, a wrong URL)
// is dead-lettered (schema_refused, its error naming the type), and the
// event after it, of a registered type, is published: one event's type
// does not hold the stream for ever.
func TestRegistrySchemaFirstOddTypeDeadLettered(t *testing.T) {
	reg := registrytest.Start(t)
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	typ := "Odd" + strings.ReplaceAll(outbox.NewID(), "-", "")
	if _, err := cl.CreateSchema(t.Context(), typ, sr.Schema{Type: sr.TypeAvro, Schema: `{"type":"record","name":"Odd","fields":[{"name":"id","type":"long"}]}`}); err != nil {
		t.Fatal(err)
	}
	streaming(t, baseEnv(pg, kc).with("WALRELAY_KAFKA_VALUE_FORMAT", "registered_avro", "WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", reg.URL()))
	odd, good := outbox.NewID(), outbox.NewID()
	for _, row := range [][2]string{{odd, ".."}, {good, typ}} {
		if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'agg', $2, '{\"id\": 1}')", row[0], row[1]); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := col.Wait(ctx, func(rs []*kgo.Record) bool {
		n := 0
		for _, r := range rs {
			if id := sink.Header(r, "id"); id == odd || id == good {
				n++
			}
		}
		return n == 2
	}); err != nil {
		t.Fatalf("the event of type .. and the one after it did not both arrive (the stream held by one event's type?): %v", err)
	}
	for _, r := range col.Records() {
		switch sink.Header(r, "id") {
		case odd:
			errText := string(kafkatest.Header(r, sink.HeaderError))
			if r.Topic != kc.dlq() || string(kafkatest.Header(r, sink.HeaderReason)) != sink.ReasonSchemaRefused || !strings.Contains(errText, `type ".."`) {
				t.Errorf("type ..: topic %s reason %q error %q: want %s, %s, naming the type", r.Topic, kafkatest.Header(r, sink.HeaderReason), errText, kc.dlq(), sink.ReasonSchemaRefused)
			}
		case good:
			if r.Topic != kc.topic("order") {
				t.Errorf("type %s: topic %s, want %s", typ, r.Topic, kc.topic("order"))
			}
		}
	}
}
