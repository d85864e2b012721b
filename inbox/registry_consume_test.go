package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
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
		rec.Value = format.Frame(nil, uint32(id), body)
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
