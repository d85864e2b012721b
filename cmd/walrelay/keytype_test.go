package main

import (
	"strings"
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
