package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/outbox"
)

// TestKeyFollowsAggregateIDType: with kafka.key_format json_schema, a
// bigint aggregate id column gives the key Debezium's JsonConverter writes
// for it (schema int64, the id a JSON number), from the WAL and from the
// poll source; a nullable uuid column, an optional io.debezium.data.Uuid
// string.
func TestKeyFollowsAggregateIDType(t *testing.T) {
	t.Parallel()
	const u = "0b7e9a8c-1f2d-4e5a-9b6c-7d8e9f0a1b2c"
	for _, c := range []struct {
		source, alter, agg, want string
	}{
		{"wal", "TYPE bigint USING aggregateid::bigint", "4294967296", `{"schema":{"type":"int64","optional":false},"payload":4294967296}`},
		{"poll", "TYPE bigint USING aggregateid::bigint", "4294967296", `{"schema":{"type":"int64","optional":false},"payload":4294967296}`},
		{"wal", "TYPE uuid USING aggregateid::uuid, ALTER COLUMN aggregateid DROP NOT NULL", u, `{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Uuid","version":1},"payload":"` + u + `"}`},
	} {
		t.Run(c.source+" "+strings.Fields(c.alter)[1], func(t *testing.T) {
			t.Parallel()
			set, envOf := setup, baseEnv
			if c.source == "poll" {
				set, envOf = setupPoll, pollEnv
			}
			pg, kc, col := set(t)
			e := envOf(pg, kc)
			conn := connect(t, pg.DSN)
			if _, err := conn.Exec(t.Context(), "ALTER TABLE outbox ALTER COLUMN aggregateid "+c.alter); err != nil {
				t.Fatal(err)
			}
			e = e.with("WALRELAY_KAFKA_KEY_FORMAT", "json_schema")
			if c.source == "poll" {
				polling(t, e)
			} else {
				streaming(t, e)
			}
			id := outbox.NewID()
			if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', $2, 'T', '{}')", id, c.agg); err != nil {
				t.Fatal(err)
			}
			waitAll(t, col, []string{id}, time.Minute)
			for _, r := range col.Records() {
				if string(kafkatest.Header(r, "id")) == id && string(r.Key) != c.want {
					t.Errorf("key %s, want %s", r.Key, c.want)
				}
			}
		})
	}
}

// TestAvroKeyTypeRefused: with kafka.key_format avro, an aggregate id
// column of a type whose key schema walrelay does not know (numeric) is
// refused at start, naming the column, from the WAL and the poll source.
func TestAvroKeyTypeRefused(t *testing.T) {
	t.Parallel()
	for _, source := range []string{"wal", "poll"} {
		t.Run(source, func(t *testing.T) {
			t.Parallel()
			set, envOf := setup, baseEnv
			if source == "poll" {
				set, envOf = setupPoll, pollEnv
			}
			pg, kc, _ := set(t)
			conn := connect(t, pg.DSN)
			if _, err := conn.Exec(t.Context(), "ALTER TABLE outbox ALTER COLUMN aggregateid TYPE numeric USING aggregateid::numeric"); err != nil {
				t.Fatal(err)
			}
			p := start(t, envOf(pg, kc).with("WALRELAY_KAFKA_KEY_FORMAT", "avro", "WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", "http://127.0.0.1:1"), "run")
			code := p.exit(time.Minute)
			t.Log(lastLine(p.out.String()))
			if want := "kafka.key_format avro: type oid 1700: the aggregate id column's type has no key schema here"; code == 0 || !strings.Contains(p.out.String(), want) || !strings.Contains(p.out.String(), "outbox.aggregateid") {
				t.Fatalf("exit %d, want a refusal naming outbox.aggregateid with %q:\n%s", code, want, tail(p.out.String(), 20))
			}
		})
	}
}

// TestAvroKeySchemaRefusedStops: with kafka.key_format avro, a registry
// refusing the topic's key schema (409: a DDL on the aggregate id column
// changed it) stops walrelay with an error naming <topic>-key and what to
// do, nothing dead-lettered and nothing confirmed past the event: once
// the subject takes the schema, walrelay started again publishes it. Each
// event of the topic was dead-lettered schema_refused.
func TestAvroKeySchemaRefusedStops(t *testing.T) {
	t.Parallel()
	var refuse atomic.Bool
	refuse.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		switch {
		case r.URL.Path == "/subjects": // walrelay's check of the URL at start
			fmt.Fprint(w, `[]`)
		case refuse.Load() && strings.Contains(r.URL.Path, "-key/versions"):
			w.WriteHeader(http.StatusConflict)
			fmt.Fprint(w, `{"error_code":409,"message":"Schema being registered is incompatible with an earlier schema for subject"}`)
		case refuse.Load() && strings.Contains(r.URL.Path, "-key"):
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"error_code":40403,"message":"Schema not found"}`)
		default:
			fmt.Fprint(w, `{"id":1}`)
		}
	}))
	defer srv.Close()
	pg, kc, col := setup(t)
	e := baseEnv(pg, kc).with("WALRELAY_KAFKA_KEY_FORMAT", "avro", "WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", srv.URL,
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_AUTO_REGISTER", "true")
	p := streaming(t, e)
	conn := connect(t, pg.DSN)
	id := outbox.NewID()
	if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'o-1', 'T', '{}')", id); err != nil {
		t.Fatal(err)
	}
	code := p.exit(time.Minute)
	out := p.out.String()
	t.Log(lastLine(out))
	if subject := kc.topic("order") + "-key"; code == 0 || !strings.Contains(out, subject) || !strings.Contains(out, "start walrelay again") {
		t.Fatalf("exit %d, want walrelay stopped naming %s and what to do:\n%s", code, subject, tail(out, 20))
	}
	refuse.Store(false)
	streaming(t, e)
	waitAll(t, col, []string{id}, time.Minute)
	for _, r := range col.Records() {
		if r.Topic == kc.dlq() {
			t.Errorf("dead-lettered: %s", kafkatest.Header(r, "walrelay.error"))
		}
	}
}
