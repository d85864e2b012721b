package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/outbox"
)

// TestSeveralOutboxTables: a relay of the default outbox gains a second
// outbox table of another layout (its own column names, a header column, a
// topic template of its own) through outbox.tables. check names the table
// the publication lacks and how to add it; run adds it at start; rows of
// both tables, in shared and separate transactions, each reach their topic
// with their own key, type and headers; the counters are by table; check
// then passes; replay must be told which table.
func TestSeveralOutboxTables(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	ctx := t.Context()

	// The default relay, one table.
	e := baseEnv(pg, kc)
	p := streaming(t, e)
	before := []string{outbox.NewID()}
	if _, err := conn.Exec(ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'o-0', 'OrderCreated', '{}')", before[0]); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, before, time.Minute)
	p.signal(syscall.SIGTERM)
	if code := p.exit(time.Minute); code != 0 {
		t.Fatalf("first relay exited %d", code)
	}

	if _, err := conn.Exec(ctx, `CREATE SCHEMA billing;
		CREATE TABLE billing.events (event_id uuid PRIMARY KEY, kind text NOT NULL, account text NOT NULL, event_type text NOT NULL, body text, tenant text)`); err != nil {
		t.Fatal(err)
	}
	tables, err := json.Marshal([]map[string]any{
		{"table": "public.outbox"},
		{"table": "billing.events", "id_column": "event_id", "aggregate_type_column": "kind", "aggregate_id_column": "account",
			"type_column": "event_type", "payload_column": "body", "header_columns": []string{"tenant"}, "topic": kc.topic("billing.{type}")},
	})
	if err != nil {
		t.Fatal(err)
	}
	adminAddr := freeAddr(t)
	e = e.with("WALRELAY_OUTBOX_TABLES", string(tables), "WALRELAY_ADMIN_LISTEN", adminAddr)

	code, out := runCmd(t, e, "check")
	if code == 0 || !strings.Contains(out, "does not publish the outbox billing.events: ALTER PUBLICATION walrelay_outbox ADD TABLE billing.events") ||
		!strings.Contains(out, "column billing.events.event_id") {
		t.Fatalf("check before the table is published: exit %d, want it to name the missing table and check its columns\n%s", code, out)
	}
	code, out = runCmd(t, e.with("WALRELAY_POSTGRES_TABLE", "public.outbox"), "check")
	if code == 0 || !strings.Contains(out, "postgres.table (from the environment) and outbox.tables are both set") {
		t.Fatalf("postgres.table with outbox.tables: exit %d\n%s", code, out)
	}

	p = streaming(t, e)
	p.waitLog("added an outbox table to the publication", 10*time.Second)
	type want struct{ topic, key, typ, tenant string }
	wants := map[string]want{}
	var ids []string
	for i := range 30 {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if i%3 != 2 { // a row of the default outbox, in two of three transactions
			id := outbox.NewID()
			if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', $2, 'OrderCreated', '{}')", id, fmt.Sprintf("o-%d", i)); err != nil {
				t.Fatal(err)
			}
			wants[id] = want{kc.topic("order"), fmt.Sprintf("o-%d", i), "OrderCreated", ""}
			ids = append(ids, id)
		}
		if i%3 != 0 { // a billing event in two of three
			id := outbox.NewID()
			typ := []string{"Invoiced", "Paid"}[i%2]
			if _, err := tx.Exec(ctx, "INSERT INTO billing.events (event_id, kind, account, event_type, body, tenant) VALUES ($1, 'account', $2, $3, 'text body', $4)",
				id, fmt.Sprintf("a-%d", i), typ, fmt.Sprintf("t-%d", i)); err != nil {
				t.Fatal(err)
			}
			wants[id] = want{kc.topic("billing." + typ), fmt.Sprintf("a-%d", i), typ, fmt.Sprintf("t-%d", i)}
			ids = append(ids, id)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, col, ids, time.Minute)
	byID := map[string]*kgo.Record{}
	for _, r := range col.Records() {
		byID[string(kafkatest.Header(r, "id"))] = r
	}
	perTable := map[string]int{}
	for id, w := range wants {
		r := byID[id]
		if r.Topic != w.topic || string(r.Key) != w.key || string(kafkatest.Header(r, "type")) != w.typ || string(kafkatest.Header(r, "tenant")) != w.tenant {
			t.Fatalf("event %s: topic %s, key %s, type %s, tenant %q; want %+v", id, r.Topic, r.Key, kafkatest.Header(r, "type"), kafkatest.Header(r, "tenant"), w)
		}
		if w.tenant != "" {
			if string(r.Value) != "text body" {
				t.Fatalf("billing event %s: value %q", id, r.Value)
			}
			perTable[w.topic]++
		} else {
			perTable["outbox"]++
		}
	}
	body := httpGet(t, "http://"+adminAddr+"/metrics")
	for topic, n := range perTable {
		table := "billing.events"
		if topic == "outbox" {
			table, topic = "public.outbox", kc.topic("order")
		}
		got, _ := metricValue(body, `walrelay_events_published_total{table="`+table+`",topic="`+topic+`"}`)
		if got != float64(n) {
			t.Fatalf("published counter of %s on %s: %v, want %d\n%s", table, topic, got, n, body)
		}
	}

	code, out = runCmd(t, e, "check")
	if code != 0 || !strings.Contains(out, "walrelay_outbox publishes public.outbox, billing.events alone") {
		t.Fatalf("check with both tables published: exit %d\n%s", code, out)
	}
	code, out = runCmd(t, e, "replay", "--all")
	if code == 0 || !strings.Contains(out, "there are several outbox tables (public.outbox, billing.events): name one with --table") {
		t.Fatalf("replay without --table: exit %d\n%s", code, out)
	}
	code, out = runCmd(t, e, "replay", "--all", "--table", "billing.events")
	if code != 0 || !strings.Contains(out, "would send 20 rows of billing.events") {
		t.Fatalf("replay --table billing.events: exit %d\n%s", code, out)
	}
	p.signal(syscall.SIGTERM)
	if code := p.exit(time.Minute); code != 0 {
		t.Fatalf("relay exited %d", code)
	}
}
