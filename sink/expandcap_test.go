package sink

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/format/schemafirst"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/sink/record"
)

// TestExpandedOverCapIsDeadLettered: a payload of 240 KB whose expanded
// value would be gigabytes (20 000 objects, each with a key of its own:
// each is written with a null for each of the 19 999 others) is
// dead-lettered too_large, naming the cap, and not written past the
// topic's batch cap: the allocations made while publishing it stay some
// MiB, in the JSON formats with expansion and in Avro. The next event is
// published.
func TestExpandedOverCapIsDeadLettered(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		fmt.Fprint(w, `{"id":1}`)
	}))
	defer srv.Close()
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := range 20000 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"k%d":1}`, i)
	}
	b.WriteString("]}")
	payload := []byte(b.String())
	for _, f := range []record.Format{record.FormatJSON, record.FormatJSONSchema, record.FormatAvro} {
		t.Run(string(f), func(t *testing.T) {
			kc := kafkatest.Start(t)
			cfg := Config{ValueFormat: f, ExpandJSONPayload: true}
			if f == record.FormatAvro {
				// A schema bound above the inferred one's (1 MB): the
				// value's bound is the one met.
				reg, err := registry.New(registry.Config{URL: srv.URL, AutoRegister: true, MaxSchemaBytes: 8 << 20})
				if err != nil {
					t.Fatal(err)
				}
				cfg.Avro = format.NewAvroEncoder(reg)
			}
			s := newSink(t, kc, cfg)
			if err := publish(t, s, newEvent("warm")); err != nil {
				t.Fatal(err)
			}
			big := newEvent("big")
			big.Payload = payload
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			if err := publish(t, s, big); err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&after)
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%s: %d KB payload: %d KiB allocated", f, len(payload)>>10, alloc>>10)
			if alloc > 64<<20 {
				t.Errorf("%d MiB allocated for a %d KB payload", alloc>>20, len(payload)>>10)
			}
			if err := publish(t, s, newEvent("next")); err != nil {
				t.Fatal(err)
			}
			col, _ := kafkatest.Collect(kc.Addrs(), `walrelay\.dlq`)
			defer col.Close()
			recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) == 1 })
			if err != nil {
				t.Fatal(err)
			}
			reason, why := string(kafkatest.Header(recs[0], HeaderReason)), string(kafkatest.Header(recs[0], HeaderError))
			t.Logf("dead letter: %s: %s", reason, why)
			if reason != "too_large" || !strings.Contains(why, "more than the") || string(recs[0].Value) != string(payload) {
				t.Errorf("dead letter %s: %s (%d bytes)", reason, why, len(recs[0].Value))
			}
		})
	}
}

// TestRegisteredAvroOverCapIsDeadLettered (review43a): in registered_avro
// a record's missing fields are written with their defaults, so a 90 KB
// payload of empty objects in an array of a record of 50 optional fields
// is a value of 1.5 MB, and it cost some 380 MiB of heap to build before
// its size was known (walrelay killed, again on the same row after each
// restart). It is dead-lettered too_large, naming the cap, written no
// further than the topic's batch cap, and the next event is published.
func TestRegisteredAvroOverCapIsDeadLettered(t *testing.T) {
	var fields []string
	for i := range 50 {
		fields = append(fields, fmt.Sprintf(`{"name":"f%d","type":["null","long"],"default":null}`, i))
	}
	schema := `{"type":"record","name":"Order","fields":[{"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[` + strings.Join(fields, ",") + `]}}}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		if !strings.HasPrefix(r.URL.Path, "/subjects/") {
			http.NotFound(w, r)
			return
		}
		b, _ := json.Marshal(map[string]any{"subject": "Created", "version": 1, "id": 1, "schema": schema})
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	reg, err := registry.New(registry.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	sf, err := schemafirst.New(reg, schemafirst.Config{Kind: schemafirst.KindAvro})
	if err != nil {
		t.Fatal(err)
	}
	kc := kafkatest.Start(t)
	s := newSink(t, kc, Config{ValueFormat: record.FormatRegisteredAvro, SchemaFirst: sf})
	warm := newEvent("warm")
	warm.Payload = []byte(`{"items":[{}]}`)
	if err := publish(t, s, warm); err != nil {
		t.Fatal(err)
	}
	big := newEvent("big")
	big.Payload = []byte(`{"items":[` + strings.Repeat("{},", 29999) + `{}]}`)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := publish(t, s, big); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d KB payload: %d KiB allocated", len(big.Payload)>>10, alloc>>10)
	if alloc > 32<<20 {
		t.Errorf("%d MiB allocated for a %d KB payload", alloc>>20, len(big.Payload)>>10)
	}
	next := newEvent("next")
	next.Payload = []byte(`{"items":[]}`)
	if err := publish(t, s, next); err != nil {
		t.Fatal(err)
	}
	col, _ := kafkatest.Collect(kc.Addrs(), `walrelay\.dlq`)
	defer col.Close()
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) == 1 })
	if err != nil {
		t.Fatal(err)
	}
	reason, why := string(kafkatest.Header(recs[0], HeaderReason)), string(kafkatest.Header(recs[0], HeaderError))
	t.Logf("dead letter: %s: %s", reason, why)
	if reason != "too_large" || !strings.Contains(why, "registered_avro") || !strings.Contains(why, "more than the") || string(recs[0].Value) != string(big.Payload) {
		t.Errorf("dead letter %s: %s (%d bytes)", reason, why, len(recs[0].Value))
	}
}
