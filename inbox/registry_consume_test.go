package inbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/format/schemafirst"
	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/outbox"
)

// TestRegistryConsumeDecodes (a real Apicurio Registry:
// WALRELAY_TEST_REGISTRY=1): a consumer with Config.Registry hands the
// handler messages whose Decode gives the Avro record each value carries,
// by the id in its framing, and whose SchemaID is that id; each handled
// once.
func TestRegistryConsumeDecodes(t *testing.T) {
	r := registrytest.Start(t)
	e := setup(t, 1)
	schema := `{"type":"record","name":"Order","fields":[{"name":"seq","type":"long"},{"name":"note","type":["null","string"],"default":null}]}`
	cl, err := sr.NewClient(sr.URLs(r.URL()))
	if err != nil {
		t.Fatal(err)
	}
	id, err := cl.RegisterSchema(t.Context(), topic+"-value", sr.Schema{Schema: schema, Type: sr.TypeAvro}, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	s := avro.MustParse(schema)
	var recs []*kgo.Record
	want := map[string]bool{}
	for i := range 5 {
		body, err := avro.Marshal(s, map[string]any{"seq": int64(i + 1), "note": map[string]any{"string": fmt.Sprint("n", i)}})
		if err != nil {
			t.Fatal(err)
		}
		ev := outbox.NewID()
		rec := event(ev, "order-1", i+1)
		rec.Value = registry.Frame(nil, uint32(id), body)
		recs, want[ev] = append(recs, rec), true
	}
	reg, err := inbox.NewRegistry(inbox.RegistryConfig{URL: r.URL()})
	if err != nil {
		t.Fatal(err)
	}
	e.produce(t, recs...)
	stop := e.start(t, inbox.Config{Registry: reg}, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		var v struct {
			Seq  int64   `avro:"seq"`
			Note *string `avro:"note"`
		}
		if err := m.Decode(ctx, &v); err != nil {
			return err
		}
		if got, ok := m.SchemaID(); !ok || int(got) != id || v.Note == nil || *v.Note != fmt.Sprint("n", v.Seq-1) {
			return fmt.Errorf("id %d %v, note %v", got, ok, v.Note)
		}
		_, err := tx.Exec(ctx, "INSERT INTO effects (event_id, key, seq) VALUES ($1, $2, $3)", m.ID, string(m.Key), v.Seq)
		return err
	})
	deadline := time.Now().Add(time.Minute)
	for e.count(t) < len(want) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e.checkOnce(t, want)
}

// TestRegistryConsumeProtobufAndJSONSchema (a real Apicurio Registry:
// WALRELAY_TEST_REGISTRY=1): records that walrelay's registered_protobuf
// and registered_jsonschema formats wrote, on one topic, reach the
// handler whose Message.Decoded gives each one's schema id, type and
// value. The registry is down when the consumer starts: the first record
// is retried well past MaxAttempts, nothing dead-lettered, and once the
// registry answers every record is handled once.
func TestRegistryConsumeProtobufAndJSONSchema(t *testing.T) {
	r := registrytest.Start(t)
	e := setup(t, 1)
	ctx := t.Context()
	w, err := registry.New(registry.Config{URL: r.URL()})
	if err != nil {
		t.Fatal(err)
	}
	protoID, err := w.Client().RegisterSchema(ctx, "OrderCreated", sr.Schema{Type: sr.TypeProtobuf,
		Schema: `syntax = "proto3"; package shop; message OrderCreated { int64 seq = 1; string note = 2; }`}, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	jsonID, err := w.Client().RegisterSchema(ctx, "OrderPaid", sr.Schema{Type: sr.TypeJSON,
		Schema: `{"type":"object","properties":{"seq":{"type":"integer"}},"required":["seq"]}`}, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	encs := map[string]*schemafirst.Encoder{}
	for typ, kind := range map[string]string{"OrderCreated": schemafirst.KindProtobuf, "OrderPaid": schemafirst.KindJSONSchema} {
		if encs[typ], err = schemafirst.New(w, schemafirst.Config{Kind: kind}); err != nil {
			t.Fatal(err)
		}
	}
	var recs []*kgo.Record
	want := map[string]bool{}
	for i := range 6 {
		typ := "OrderCreated"
		if i%2 == 1 {
			typ = "OrderPaid"
		}
		v, err := encs[typ].Value(ctx, topic, typ, fmt.Appendf(nil, `{"seq": %d}`, i+1), 0)
		if err != nil {
			t.Fatal(err)
		}
		ev := outbox.NewID()
		rec := event(ev, "order-1", i+1)
		rec.Value = v
		recs, want[ev] = append(recs, rec), true
	}
	px := r.Proxy(t)
	px.Down()
	reg, err := inbox.NewRegistry(inbox.RegistryConfig{URL: "http://" + px.Addr() + registrytest.CCompatPath})
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := kafkatest.Collect(e.kc.Addrs(), `walrelay\.inbox\.dlq`)
	if err != nil {
		t.Fatal(err)
	}
	defer dlq.Close()
	e.produce(t, recs...)
	var runs atomic.Int32
	stop := e.start(t, inbox.Config{Registry: reg, MaxAttempts: 2, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond},
		func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			runs.Add(1)
			d, err := m.Decoded(ctx)
			if err != nil {
				return err
			}
			var seq int64
			switch v := d.Value.(type) {
			case proto.Message: // registered_protobuf
				if d.Type != inbox.Protobuf || d.Message != "shop.OrderCreated" || int(d.ID) != protoID || m.Type != "OrderCreated" {
					return fmt.Errorf("protobuf: %+v", d)
				}
				seq = v.ProtoReflect().Get(v.ProtoReflect().Descriptor().Fields().ByName("seq")).Int()
			case map[string]any: // registered_jsonschema
				if d.Type != inbox.JSONSchema || int(d.ID) != jsonID {
					return fmt.Errorf("json schema: %+v", d)
				}
				seq = int64(v["seq"].(float64))
			default:
				return fmt.Errorf("a %T", d.Value)
			}
			_, err = tx.Exec(ctx, "INSERT INTO effects (event_id, key, seq) VALUES ($1, $2, $3)", m.ID, string(m.Key), seq)
			return err
		})
	waitfor.Until(t, 30*time.Second, "the first record retried 5 times while the registry is down", func() bool { return runs.Load() >= 5 })
	if n := e.count(t); n != 0 || len(dlq.Records()) != 0 {
		t.Fatalf("while the registry is down: %d handled, %d dead-lettered", n, len(dlq.Records()))
	}
	px.Up()
	waitfor.Until(t, 30*time.Second, "every record handled", func() bool { return e.count(t) >= len(want) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e.checkOnce(t, want)
	if n := len(dlq.Records()); n != 0 {
		t.Fatalf("%d dead letters, want none", n)
	}
}
