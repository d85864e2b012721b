package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/sink/record"
)

// TestAvroKeySchemaRefusedStops: in the avro key format, the key's schema
// follows the aggregate id column (its type and NOT NULL), the same for
// every event of the topic, so a registry refusing it (409 incompatible
// after a DDL made the column NOT NULL or changed its type; or, without
// auto-registration, not having it under <topic>-key) is a configuration
// to mend, not a bad event: walrelay stops (a fatal error naming the
// subject and what to do), nothing dead-lettered, as for ErrKeyType and
// as Debezium's converter fails its task. It dead-lettered every event of
// the topic (the review's
// TestProbeAvroKeySchemaRefusedDeadLettersEveryEvent).
func TestAvroKeySchemaRefusedStops(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name         string
		autoRegister bool
		want         error
		says         string
	}{
		{"refused (409)", true, registry.ErrRefused, "compatibility"},
		{"not registered", false, registry.ErrNotRegistered, "register"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
				switch {
				case strings.Contains(r.URL.Path, "-key/versions"): // register: incompatible with the latest
					w.WriteHeader(http.StatusConflict)
					fmt.Fprint(w, `{"error_code":409,"message":"Schema being registered is incompatible with an earlier schema for subject"}`)
				case strings.Contains(r.URL.Path, "-key"): // look up: not under the subject
					w.WriteHeader(http.StatusNotFound)
					fmt.Fprint(w, `{"error_code":40403,"message":"Schema not found"}`)
				default:
					fmt.Fprint(w, `{"id":1}`)
				}
			}))
			defer srv.Close()
			reg, err := registry.New(registry.Config{URL: srv.URL, AutoRegister: c.autoRegister})
			if err != nil {
				t.Fatal(err)
			}
			kc := kafkatest.Start(t)
			s := newSink(t, kc, Config{KeyFormat: record.FormatAvro, Avro: format.NewAvroEncoder(reg)})
			e := newEvent("e0")
			e.AggregateID, e.AggregateIDType = "42", format.OIDInt8 // a bigint column, made NOT NULL since
			err = publish(t, s, e)
			if !failure.IsFatal(err) || !errors.Is(err, c.want) || !strings.Contains(err.Error(), "-key") || !strings.Contains(err.Error(), c.says) {
				t.Errorf("the registry refusing the topic's key schema: %v; want a fatal %v naming the subject <topic>-key and saying %q (walrelay stops), not each event dead-lettered", err, c.want, c.says)
			}
			col, _ := kafkatest.Collect(kc.Addrs(), `walrelay\.dlq`)
			defer col.Close()
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			if recs, _ := col.Wait(ctx, func(r []*kgo.Record) bool { return len(r) > 0 }); len(recs) > 0 {
				t.Errorf("the event dead-lettered (%s: %.200s) because the registry refused the topic's key schema", kafkatest.Header(recs[0], HeaderReason), kafkatest.Header(recs[0], HeaderError))
			}
		})
	}
}

// schemaKeepingRegistry is a schema registry that keeps the first schema
// registered under each subject and refuses another (409), as Confluent's
// and Apicurio's do under BACKWARD compatibility for "long" then "string"
// (or the reverse): neither reads the other's data.
func schemaKeepingRegistry(t *testing.T) *registry.Client {
	t.Helper()
	var mu sync.Mutex
	subjects := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		if r.Method != http.MethodPost || len(parts) < 2 || parts[0] != "subjects" {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"error_code":40401,"message":"Subject not found"}`)
			return
		}
		var req struct {
			Schema string `json:"schema"`
		}
		_ = json.Unmarshal(body, &req)
		mu.Lock()
		defer mu.Unlock()
		old, ok := subjects[parts[1]]
		switch {
		case !ok:
			subjects[parts[1]] = req.Schema
			fmt.Fprint(w, `{"id":1}`)
		case old == req.Schema:
			fmt.Fprint(w, `{"id":1}`)
		case len(parts) == 3 && parts[2] == "versions": // register another
			w.WriteHeader(http.StatusConflict)
			fmt.Fprint(w, `{"error_code":409,"message":"Schema being registered is incompatible with an earlier schema for subject"}`)
		default: // look up another
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"error_code":40403,"message":"Schema not found"}`)
		}
	}))
	t.Cleanup(srv.Close)
	reg, err := registry.New(registry.Config{URL: srv.URL, AutoRegister: true})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestAvroKeySchemaOfAMessageRefusedDeadLettered: a logical decoding
// message's key is a string (AggregateIDType 0) whatever the outbox
// table's aggregate id column is, so on a topic that the table's rows
// (bigint NOT NULL: "long") and messages share, the registry refuses one
// of the two key schemas. The message's is not the table column's (the
// one checked at start): it is dead-lettered schema_refused and the stream
// moves on, where it stopped walrelay at every start on it (the review's
// TestProbe44KeySchemaOfAMessageStops). The rows' key schema refused
// (a message registered first) still stops walrelay, the error saying
// that the subject holds another key schema (a message's string, another
// table's) rather than only "revert the column".
func TestAvroKeySchemaOfAMessageRefusedDeadLettered(t *testing.T) {
	t.Parallel()
	row := func(id string) *event.Event {
		e := newEvent(id)
		e.AggregateID, e.AggregateIDType = "42", format.OIDInt8
		return e
	}
	msg := func(id string) *event.Event {
		e := newEvent(id)
		e.Source, e.AggregateID, e.AggregateIDType, e.Headers = "message", "42", 0, nil
		return e
	}
	t.Run("row then message", func(t *testing.T) {
		t.Parallel()
		kc := kafkatest.Start(t)
		s := newSink(t, kc, Config{KeyFormat: record.FormatAvro, Avro: format.NewAvroEncoder(schemaKeepingRegistry(t))})
		if err := publish(t, s, row("row-1")); err != nil {
			t.Fatalf("the first row: %v", err)
		}
		if err := publish(t, s, msg("msg")); err != nil {
			t.Fatalf("a message whose string key the registry refuses on a topic of long keys: %v (fatal %v); want it dead-lettered and the stream moving on", err, failure.IsFatal(err))
		}
		if err := publish(t, s, row("row-2")); err != nil {
			t.Fatalf("the row after the message: %v", err)
		}
		col, _ := kafkatest.Collect(kc.Addrs(), `walrelay\.dlq`)
		defer col.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		recs, err := col.Wait(ctx, func(r []*kgo.Record) bool { return len(r) > 0 })
		if err != nil || len(recs) != 1 {
			t.Fatalf("dead letters: %d (%v); want the message's", len(recs), err)
		}
		d := recs[0]
		if id, reason := string(kafkatest.Header(d, "id")), string(kafkatest.Header(d, HeaderReason)); id != "msg" || reason != ReasonSchemaRefused {
			t.Errorf("dead letter id %q reason %q; want msg, %s", id, reason, ReasonSchemaRefused)
		}
		if e := string(kafkatest.Header(d, HeaderError)); !strings.Contains(e, "message") || !strings.Contains(e, "-key") {
			t.Errorf("the dead letter's error %q does not say that a message's key schema (a string) was refused under <topic>-key", e)
		}
	})
	t.Run("message then row", func(t *testing.T) {
		t.Parallel()
		kc := kafkatest.Start(t)
		s := newSink(t, kc, Config{KeyFormat: record.FormatAvro, Avro: format.NewAvroEncoder(schemaKeepingRegistry(t))})
		if err := publish(t, s, msg("msg")); err != nil {
			t.Fatalf("the first message: %v", err)
		}
		err := publish(t, s, row("row"))
		if !failure.IsFatal(err) || !errors.Is(err, registry.ErrRefused) {
			t.Fatalf("the table's key schema refused: %v; want a fatal %v", err, registry.ErrRefused)
		}
		if !strings.Contains(err.Error(), "logical message") || !strings.Contains(err.Error(), "outbox.event.order-key") {
			t.Errorf("the error %q does not name the subject and that it may hold a logical message's key schema", err)
		}
	})
}

// TestRegistryWriterPanicIsDeadLettered: a panic of the code that writes
// a registry format's key or value (hamba/avro, Go's protobuf or the JSON
// Schema validator, on a registry's schema or an application's payload:
// pbfix44 found one in protojson) is that event's format error,
// dead-lettered (reason format) with the panic's text, and the next event
// is published: left to run, it stopped walrelay, and again at every
// start on the same event. The panic here is the writer's own: an encoder
// the sink calls that is nil.
func TestRegistryWriterPanicIsDeadLettered(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	reg, err := registry.New(registry.Config{URL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	s := newSink(t, kc, Config{KeyFormat: record.FormatAvro, Avro: format.NewAvroEncoder(reg)})
	s.cfg.Avro = nil // the writer panics
	if err := publish(t, s, newEvent("e0")); err != nil {
		t.Fatalf("an event whose key's writer panicked: %v, want it dead-lettered", err)
	}
	col, _ := kafkatest.Collect(kc.Addrs(), `walrelay\.dlq`)
	defer col.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	recs, err := col.Wait(ctx, func(r []*kgo.Record) bool { return len(r) > 0 })
	if err != nil || len(recs) != 1 {
		t.Fatalf("dead letters: %d, %v", len(recs), err)
	}
	if reason, why := string(kafkatest.Header(recs[0], HeaderReason)), string(kafkatest.Header(recs[0], HeaderError)); reason != ReasonFormat || !strings.Contains(why, "panicked") {
		t.Errorf("dead letter: reason %q, error %q; want %q saying the writer panicked", reason, why, ReasonFormat)
	}
}
