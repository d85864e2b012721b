package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/outbox"
)

// debeziumSetup is setup against the real broker (Debezium runs in Kafka
// Connect, which kfake does not host): the test skips on kfake.
func debeziumSetup(t *testing.T) (*pgtest.Server, *broker, *kafkatest.Collector) {
	t.Helper()
	if os.Getenv(kafkatest.EnvKafka) != "real" {
		t.Skip("Debezium runs in Kafka Connect against the real broker: WALRELAY_TEST_KAFKA=real")
	}
	return setup(t)
}

// debeziumOutbox is the configuration of Debezium's outbox connector of
// these tests: slot, the publication walrelay migrate made, the EventRouter
// routing to topic, StringConverters (on the worker).
func debeziumOutbox(pg *pgtest.Server, kc *broker, slot, topic string) (worker, connector map[string]string) {
	return kafkatest.DebeziumOutbox(kc.Addrs(), pg.Port(), slot, strings.TrimSuffix(kc.prefix, ".")+"dbz", topic)
}

// apicurioConverter is Apicurio's converters (AvroConverter), put on
// Debezium's class path when the worker uses one.
const apicurioConverter = "io.apicurio:apicurio-registry-utils-converter:" + registrytest.Version

// apicurioAvro sets the worker's key and value converters to Apicurio's
// AvroConverter writing Confluent's wire format with content ids (the id
// in the value: headers.enabled=false), and
// registering its schemas, in the registry r.
func apicurioAvro(worker map[string]string, r *registrytest.Registry) {
	for _, side := range []string{"key", "value"} {
		c := side + ".converter"
		worker[c] = "io.apicurio.registry.utils.converter.AvroConverter"
		worker[c+".apicurio.registry.url"] = r.Base() + "/apis/registry/v2"
		worker[c+".apicurio.registry.auto-register"] = "true"
		worker[c+".apicurio.registry.as-confluent"] = "true"
		worker[c+".apicurio.registry.use-id"] = "contentId"
		// The id in the value, not in a header (the default).
		worker[c+".apicurio.registry.headers.enabled"] = "false"
	}
}

// startDebezium starts Debezium and waits until it holds its slot.
func startDebezium(t *testing.T, conn *pgx.Conn, worker, connector map[string]string) *kafkatest.Connect {
	t.Helper()
	var extra []string
	if strings.HasPrefix(worker["value.converter"], "io.apicurio.") {
		extra = append(extra, apicurioConverter)
	}
	c, err := kafkatest.StartDebeziumWith(t.Context(), extra, worker, connector)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	slot := connector["slot.name"]
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var active bool
		err := conn.QueryRow(t.Context(), "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		if err == nil && active {
			return c
		}
		select {
		case <-c.Done():
			t.Fatalf("Debezium exited:\n%s", c.Logs())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("Debezium did not take slot %s in 5 minutes:\n%s", slot, c.Logs())
		}
	}
}

// TestDebeziumParity runs Debezium 3.6 (PostgreSQL connector, outbox
// EventRouter) and walrelay side by side on two slots of one publication,
// with each converter setting (StringConverter; JsonConverter with
// schemas.enable false and true, walrelay's json and json_schema formats;
// the last also with a text and a bytea payload column, whose schemas
// differ, and a bytea payload is base64), and compares, event by event,
// the topic, partition, key, value and id header: byte for byte, payloads
// with escapes, unicode (outside the BMP too) and nesting included.
func TestDebeziumParity(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, converter, schemas, format, payloadType string
		expand, registry                              bool
		// aggType, if set, is the aggregate id column's type: bigint or
		// smallint (NOT NULL), or uuid (nullable), whose keys Debezium
		// writes in the column's own schema (#38).
		aggType string
	}{
		{"string", "org.apache.kafka.connect.storage.StringConverter", "", "raw", "", false, false, ""},
		{"json", "org.apache.kafka.connect.json.JsonConverter", "false", "json", "", false, false, ""},
		{"json_schema", "org.apache.kafka.connect.json.JsonConverter", "true", "json_schema", "", false, false, ""},
		{"json_schema_text", "org.apache.kafka.connect.json.JsonConverter", "true", "json_schema", "text", false, false, ""},
		{"json_schema_bytea", "org.apache.kafka.connect.json.JsonConverter", "true", "json_schema", "bytea", false, false, ""},
		{"json_schema_not_null", "org.apache.kafka.connect.json.JsonConverter", "true", "json_schema", "jsonb NOT NULL", false, false, ""},
		{"json_expand", "org.apache.kafka.connect.json.JsonConverter", "false", "json", "", true, false, ""},
		{"json_schema_text_expand", "org.apache.kafka.connect.json.JsonConverter", "true", "json_schema", "text", true, false, ""},
		// Apicurio's AvroConverter (as-confluent, contentId) and walrelay's
		// avro format, against a real Apicurio Registry
		// (WALRELAY_TEST_REGISTRY=1): both register in it.
		{"avro", "", "", "avro", "", false, true, ""},
		{"avro_expand", "", "", "avro", "", true, true, ""},
		{"avro_text_expand", "", "", "avro", "text", true, true, ""},
		{"avro_bytea", "", "", "avro", "bytea", false, true, ""},
		{"avro_not_null", "", "", "avro", "jsonb NOT NULL", false, true, ""},
		{"json_schema_bigint_key", "org.apache.kafka.connect.json.JsonConverter", "true", "json_schema", "", false, false, "bigint"},
		{"avro_bigint_key", "", "", "avro", "", false, true, "bigint"},
		{"avro_uuid_key", "", "", "avro", "", false, true, "uuid"},
		{"avro_smallint_key", "", "", "avro", "", false, true, "smallint"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pg, kc, col := debeziumSetup(t)
			var reg *registrytest.Registry
			if c.registry {
				reg = registrytest.Start(t)
			}
			conn := connect(t, pg.DSN)
			notNull := strings.HasSuffix(c.payloadType, " NOT NULL")
			if notNull {
				execSQL(t, conn, "ALTER TABLE outbox ALTER COLUMN payload SET NOT NULL")
			} else if c.payloadType != "" {
				using := "payload::text"
				if c.payloadType == "bytea" {
					using = "convert_to(payload::text, 'UTF8')"
				}
				execSQL(t, conn, "ALTER TABLE outbox ALTER COLUMN payload TYPE "+c.payloadType+" USING "+using)
			}
			// agg is the aggregate id of the column's type for a number.
			agg := func(prefix string, i int) string { return fmt.Sprintf("%s%d", prefix, i) }
			w := newWriter(20, 51)
			switch c.aggType {
			case "bigint":
				execSQL(t, conn, "ALTER TABLE outbox ALTER COLUMN aggregateid TYPE bigint USING aggregateid::bigint")
				agg = func(_ string, i int) string { return fmt.Sprint(int64(1)<<32 + int64(i)) }
				w.prefix = "42949672" // 42949672<0..19>: most beyond an int
			case "smallint":
				execSQL(t, conn, "ALTER TABLE outbox ALTER COLUMN aggregateid TYPE smallint USING aggregateid::smallint")
				agg = func(_ string, i int) string { return fmt.Sprint(-32768 + i) }
				w.prefix = "327" // 3270..32719
			case "uuid":
				execSQL(t, conn, "ALTER TABLE outbox ALTER COLUMN aggregateid TYPE uuid USING aggregateid::uuid, ALTER COLUMN aggregateid DROP NOT NULL")
				agg = func(_ string, i int) string { return fmt.Sprintf("0b7e9a8c-1f2d-4e5a-9b6c-7d8e9f0a%04d", i) }
				w = newWriter(10, 51)
				w.prefix = "0b7e9a8c-1f2d-4e5a-9b6c-7d8e9f0a1b2" // and one digit
			}
			execSQL(t, conn, "SELECT pg_create_logical_replication_slot('dbz', 'pgoutput')")
			dbzCol, err := kafkatest.Collect(kc.Addrs(), regexp.QuoteMeta(kc.prefix)+`dbz\.outbox\.event\..*`)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(dbzCol.Close)
			worker, connector := debeziumOutbox(pg, kc, "dbz", kc.prefix+"dbz.outbox.event.${routedByValue}")
			worker["key.converter"], worker["value.converter"] = c.converter, c.converter
			if c.schemas != "" {
				worker["key.converter.schemas.enable"], worker["value.converter.schemas.enable"] = c.schemas, c.schemas
			}
			e := baseEnv(pg, kc).with("WALRELAY_KAFKA_KEY_FORMAT", c.format, "WALRELAY_KAFKA_VALUE_FORMAT", c.format)
			if reg != nil {
				apicurioAvro(worker, reg)
				e = e.with("WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", reg.URL(), "WALRELAY_KAFKA_SCHEMA_REGISTRY_AUTO_REGISTER", "true")
			}
			if c.expand {
				connector["transforms.outbox.table.expand.json.payload"] = "true"
				e = e.with("WALRELAY_KAFKA_EXPAND_JSON_PAYLOAD", "true")
			}
			startDebezium(t, conn, worker, connector)
			streaming(t, e)

			if err := w.write(t.Context(), conn, 400, 10); err != nil {
				t.Fatal(err)
			}
			odd := []*string{ptr(`{"text": "quote \" backslash \\ slash / tab \t newline \n"}`), ptr(`{"unicode": "é ß 中文 😀 \u2028", "n": 1.50, "e": 1e3}`),
				ptr(`{"nested": {"a": [1, {"b": null}], "c": true}}`), ptr(`[1, 2, 3]`), ptr(`"just a string"`), ptr(`{"big": "` + strings.Repeat("x", 20000) + `"}`)}
			if c.expand {
				// Debezium's task fails on a top-level array (it infers
				// an array schema and writes the string in it): leave it
				// out, and compare what it expands and what it leaves a
				// string.
				odd = append(slices.DeleteFunc(odd, func(p *string) bool { return strings.HasPrefix(*p, "[") }),
					ptr(`{"d": 12345678.9, "tiny": 0.0001, "h": 100.0, "neg": -2.5e-10, "big": 4294967296, "z": 0}`),
					ptr(`{"l": [{"p": 1, "q": "x"}, {"p": 2, "q": "y"}, null], "m": [[1, 2], [3]], "e": [], "x": null, "o": {}}`),
					ptr(`{"mixed": [1, "x"]}`), ptr(`{"kinds": [1, 2.5]}`), ptr(`{"nulls": [null]}`),
					// merged items (a required record), Unicode names (#38 review)
					ptr(`{"merged": [{"a": 1}, {"a": 2, "b": "x"}]}`), ptr(`{"ünï": {"ö": 1, "ǅ": [1]}}`))
				if c.payloadType == "text" {
					// Kept as written only in a text column (jsonb writes
					// 1e400 as a 401-digit integer, and refuses a lone
					// surrogate): ±Infinity doubles, and (avro) a lone
					// surrogate, which Java writes '?'.
					odd = append(odd, ptr(`{"inf": 1e400, "ninf": -1e400, "zero": 1e-400}`))
					if c.format == "avro" {
						odd = append(odd, ptr(`{"s": "a\ud800b", "pair": "\ud83d\ude00"}`))
					}
				}
			}
			if c.format != "raw" && !notNull {
				odd = append(odd, nil) // JSON null from both (the StringConverter's tombstone is compared elsewhere)
			}
			var oddPayloads []any
			for _, p := range odd {
				switch {
				case p == nil:
					oddPayloads = append(oddPayloads, nil)
				case c.payloadType == "bytea":
					oddPayloads = append(oddPayloads, []byte(*p))
				default:
					oddPayloads = append(oddPayloads, *p)
				}
			}
			if c.payloadType == "bytea" {
				oddPayloads = append(oddPayloads, []byte{0xff, 0x00, 0x80, 'x'}) // not UTF-8
			}
			ids := w.written()
			for i, p := range oddPayloads {
				id := outbox.NewID()
				if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'Odd', $4)",
					id, []string{"order", "customer"}[i%2], agg("odd-", i), p); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			waitAll(t, col, ids, 2*time.Minute)
			want := map[string]bool{}
			for _, id := range ids {
				want[id] = true
			}
			if _, err := dbzCol.Wait(t.Context(), func(rs []*kgo.Record) bool {
				seen := map[string]bool{}
				for _, r := range rs {
					seen[string(kafkatest.Header(r, "id"))] = true
				}
				return len(seen) >= len(ids)
			}); err != nil {
				t.Fatal(err)
			}
			byID := func(rs []*kgo.Record, topicPrefix string) map[string]*kgo.Record {
				m := map[string]*kgo.Record{}
				for _, r := range rs {
					if strings.HasPrefix(r.Topic, topicPrefix) {
						m[string(kafkatest.Header(r, "id"))] = r
					}
				}
				return m
			}
			ours, theirs := byID(col.Records(), kc.prefix+"outbox.event."), byID(dbzCol.Records(), kc.prefix+"dbz.outbox.event.")
			compared := 0
			for id := range want {
				a, b := ours[id], theirs[id]
				if a == nil || b == nil {
					t.Fatalf("event %s: walrelay %v, Debezium %v", id, a != nil, b != nil)
				}
				switch {
				case strings.TrimPrefix(a.Topic, kc.prefix) != strings.TrimPrefix(b.Topic, kc.prefix+"dbz."):
					t.Fatalf("event %s: topic %s, Debezium %s", id, a.Topic, b.Topic)
				case !bytes.Equal(a.Key, b.Key):
					t.Fatalf("event %s: key %q, Debezium %q", id, a.Key, b.Key)
				case !bytes.Equal(a.Value, b.Value):
					t.Fatalf("event %s: value %q, Debezium %q%s", id, a.Value, b.Value, registeredSchemas(t, reg, a.Value, b.Value))
				case a.Partition != b.Partition:
					t.Fatalf("event %s (key %s): partition %d, Debezium %d", id, a.Key, a.Partition, b.Partition)
				}
				compared++
			}
			t.Logf("%s: %d events, each with the same topic, partition, key, value and id from walrelay and from Debezium %s", c.name, compared, kafkatest.DebeziumVersion)
		})
	}
}

func ptr(s string) *string { return &s }

// registeredSchemas is, for a failure's message, the schemas that the
// registry holds for the ids framing the values (none without a registry).
func registeredSchemas(t *testing.T, reg *registrytest.Registry, values ...[]byte) string {
	if reg == nil {
		return ""
	}
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, v := range values {
		if id, _, err := registry.Unframe(v); err == nil {
			s, err := cl.SchemaByID(t.Context(), int(id))
			fmt.Fprintf(&b, "\nschema %d: %s %v", id, s.Schema, err)
		}
	}
	return b.String()
}

// TestDebeziumSwitchOver switches from Debezium to walrelay mid-stream as
// docs/debezium.md says, from Debezium on its defaults: Debezium creates
// its own publication (dbz_publication, FOR ALL TABLES) and slot; walrelay
// debezium import of Debezium's configuration; walrelay publication create
// while Debezium still runs (behind Debezium's slot); walrelay check until
// it says OK for the slot (Debezium has confirmed past the publication's
// creation); Debezium stopped while rows are written; walrelay started on
// Debezium's slot with the imported configuration. Every row committed is
// on the topic (what Debezium had sent but not confirmed comes again, with
// the same id).
func TestDebeziumSwitchOver(t *testing.T) {
	t.Parallel()
	pg, kc, col := debeziumSetup(t)
	conn := connect(t, pg.DSN)
	// The application's outbox table alone, as a team on Debezium has it:
	// no walrelay publication, no walrelay slot.
	execSQL(t, conn, "DROP PUBLICATION walrelay_outbox", "SELECT pg_drop_replication_slot('walrelay')")
	worker, connector := debeziumOutbox(pg, kc, "debezium", kc.prefix+"outbox.event.${routedByValue}")
	delete(connector, "publication.name") // Debezium's defaults: dbz_publication, all_tables
	delete(connector, "publication.autocreate.mode")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "worker.properties"), kafkatest.Properties(worker))
	writeFile(t, filepath.Join(dir, "connector.properties"), kafkatest.Properties(connector))
	dbz := startDebezium(t, conn, worker, connector)
	var allTables bool
	if err := conn.QueryRow(t.Context(), "SELECT puballtables FROM pg_publication WHERE pubname = 'dbz_publication'").Scan(&allTables); err != nil || !allTables {
		t.Fatalf("Debezium's default publication: all tables %v, %v", allTables, err)
	}

	w := newWriter(20, 52)
	w.dsn = pg.DSN
	stop := w.keepWriting(t.Context(), pg.DSN)
	waitfor.Until(t, time.Minute, "Debezium publishing", func() bool { return len(col.Records()) >= 500 })

	code, out := runCmd(t, env{}, "debezium", "import", filepath.Join(dir, "connector.properties"), "--worker", filepath.Join(dir, "worker.properties"))
	if code != 0 {
		t.Fatalf("debezium import: exit %d:\n%s", code, out)
	}
	yaml := out[strings.Index(out, "# walrelay configuration"):]
	cfgFile := filepath.Join(dir, "walrelay.yaml")
	writeFile(t, cfgFile, yaml)
	e := env{"WALRELAY_ADMIN_LISTEN": "", "WALRELAY_KAFKA_DLQ_TOPIC": kc.dlq()}
	if code, out := runCmd(t, e, "publication", "create", "--config", cfgFile); code != 0 || !strings.Contains(out, "keep that reader (Debezium) running") {
		t.Fatalf("publication create while Debezium runs: exit %d:\n%s", code, out)
	}
	var check string
	waitfor.Until(t, time.Minute, "walrelay check says OK for the slot", func() bool {
		_, check = runCmd(t, e, "check", "--config", cfgFile)
		return strings.HasPrefix(checkLine(check, "slot"), "OK")
	})
	dbz.Stop()
	fromDebezium := len(col.Records())

	p := start(t, e, "run", "--config", cfgFile)
	p.waitLog("msg=streaming", time.Minute)
	time.Sleep(2 * time.Second)
	if n := stop(); n != 0 {
		t.Fatalf("%d writes failed", n)
	}
	c := waitAll(t, col, committedIDs(t, conn), 2*time.Minute)
	t.Logf("switched from Debezium (%d records, its FOR ALL TABLES publication) to walrelay mid-stream (slot debezium, the imported configuration, walrelay_outbox created while Debezium ran):\n%s\n%s\n%s", fromDebezium, yaml, checkLine(check, "slot"), c)
	if c.missing != 0 {
		t.Fatalf("%d rows missing", c.missing)
	}
	p.signal(syscall.SIGTERM)
	p.exit(time.Minute)
}

// TestDebeziumMappings runs Debezium and walrelay side by side, as
// TestDebeziumParity does, with the EventRouter's mappings: a topic regex
// with groups and a replacement, a partition placement from an integer
// column (NULL: the key's partition), a header placement and one of
// another header name (type:header:eventType), the record
// timestamp from a timestamp column, and tombstones for a NULL payload
// with the JsonConverter. walrelay is configured by `debezium import` of
// Debezium's own files. Every event has the same topic, partition, key,
// value, id and version headers and (where the row has one) timestamp.
func TestDebeziumMappings(t *testing.T) {
	t.Parallel()
	pg, kc, _ := debeziumSetup(t)
	conn := connect(t, pg.DSN)
	execSQL(t, conn, "ALTER TABLE outbox ADD COLUMN shard integer, ADD COLUMN version integer, DROP COLUMN created_at, ADD COLUMN created_at timestamp") // a created_at of its own, as a Debezium user's
	execSQL(t, conn, "SELECT pg_create_logical_replication_slot('dbz', 'pgoutput')")
	ours, err := kafkatest.Collect(kc.Addrs(), regexp.QuoteMeta(kc.prefix)+`m\..*`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ours.Close)
	theirs, err := kafkatest.Collect(kc.Addrs(), regexp.QuoteMeta(kc.prefix)+`dbz\.m\..*`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(theirs.Close)
	const regex, replacement = "(?<head>[a-z])(?<rest>[a-z]+)", "m.${rest}.$1"
	worker, connector := debeziumOutbox(pg, kc, "dbz", kc.prefix+"dbz."+replacement)
	worker["key.converter"], worker["value.converter"] = "org.apache.kafka.connect.json.JsonConverter", "org.apache.kafka.connect.json.JsonConverter"
	worker["key.converter.schemas.enable"], worker["value.converter.schemas.enable"] = "false", "false"
	for k, v := range map[string]string{
		"route.topic.regex": regex, "table.fields.additional.placement": "shard:partition,version:header,type:header:eventType",
		"route.tombstone.on.empty.payload": "true", "table.field.event.timestamp": "created_at",
	} {
		connector["transforms.outbox."+k] = v
	}
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "worker.properties"), kafkatest.Properties(worker))
	writeFile(t, filepath.Join(dir, "connector.properties"), kafkatest.Properties(connector))
	startDebezium(t, conn, worker, connector)

	code, out := runCmd(t, env{}, "debezium", "import", filepath.Join(dir, "connector.properties"), "--worker", filepath.Join(dir, "worker.properties"))
	if code != 0 {
		t.Fatalf("debezium import: exit %d:\n%s", code, out)
	}
	cfgFile := filepath.Join(dir, "walrelay.yaml")
	writeFile(t, cfgFile, out[strings.Index(out, "# walrelay configuration"):])
	// walrelay on a slot of its own, its topics under its own prefix.
	p := start(t, env{"WALRELAY_ADMIN_LISTEN": "", "WALRELAY_KAFKA_DLQ_TOPIC": kc.dlq(), "WALRELAY_POSTGRES_SLOT": "walrelay",
		"WALRELAY_KAFKA_TOPIC": kc.prefix + replacement}, "run", "--config", cfgFile)
	p.waitLog("msg=streaming", time.Minute)

	var ids []string
	for i := range 300 {
		id := outbox.NewID()
		var shard, created, payload, version any
		if i%11 != 10 {
			version = i
		}
		if i%5 != 4 {
			shard = i % kafkatest.Partitions
		}
		if i%3 != 2 {
			created = time.Date(2026, 12, 3, 4, 5, 6, i*1000, time.UTC)
		}
		if i%7 != 6 {
			payload = fmt.Sprintf(`{"n": %d}`, i)
		}
		if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, shard, version, created_at) VALUES ($1, $2, $3, 'T', $4, $5, $6, $7)",
			id, []string{"order", "customer"}[i%2], fmt.Sprintf("a-%d", i%17), payload, shard, version, created); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	byID := func(col *kafkatest.Collector) map[string]*kgo.Record {
		t.Helper()
		recs, err := col.Wait(t.Context(), func(rs []*kgo.Record) bool { return len(rs) >= len(ids) })
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]*kgo.Record{}
		for _, r := range recs {
			m[string(kafkatest.Header(r, "id"))] = r
		}
		return m
	}
	a, b := byID(ours), byID(theirs)
	tombstones, placed, stamped, nullHeaders := 0, 0, 0, 0
	for i, id := range ids {
		x, y := a[id], b[id]
		switch {
		case x == nil || y == nil:
			t.Fatalf("event %d %s: walrelay %v, Debezium %v", i, id, x != nil, y != nil)
		case strings.TrimPrefix(x.Topic, kc.prefix) != strings.TrimPrefix(y.Topic, kc.prefix+"dbz."):
			t.Fatalf("event %d: topic %s, Debezium %s", i, x.Topic, y.Topic)
		case x.Partition != y.Partition:
			t.Fatalf("event %d (key %s): partition %d, Debezium %d", i, x.Key, x.Partition, y.Partition)
		case !bytes.Equal(x.Key, y.Key):
			t.Fatalf("event %d: key %q, Debezium %q", i, x.Key, y.Key)
		case !bytes.Equal(x.Value, y.Value) || (x.Value == nil) != (y.Value == nil):
			t.Fatalf("event %d: value %q, Debezium %q", i, x.Value, y.Value)
		case headerState(x, "version") != headerState(y, "version"):
			t.Fatalf("event %d: version header %s, Debezium %s", i, headerState(x, "version"), headerState(y, "version"))
		case headerState(x, "eventType") != "=T" || headerState(y, "eventType") != "=T":
			t.Fatalf("event %d: eventType header %s, Debezium %s, want =T from both", i, headerState(x, "eventType"), headerState(y, "eventType"))
		case i%3 != 2 && !x.Timestamp.Equal(y.Timestamp):
			t.Fatalf("event %d: timestamp %s, Debezium %s", i, x.Timestamp, y.Timestamp)
		}
		if x.Value == nil {
			tombstones++
		}
		if headerState(x, "version") == "null" {
			nullHeaders++
		}
		if i%5 != 4 {
			placed++
		}
		if i%3 != 2 {
			stamped++
		}
	}
	if tombstones == 0 || placed == 0 || stamped == 0 || nullHeaders == 0 {
		t.Fatalf("the test compared no tombstone (%d), placed partition (%d), timestamp (%d) or null header (%d)", tombstones, placed, stamped, nullHeaders)
	}
	t.Logf("%d events (%d tombstones, %d placed by their partition column, %d with the timestamp column's time, %d with a null header), the same topic, partition, key, value and headers from walrelay and from Debezium %s",
		len(ids), tombstones, placed, stamped, nullHeaders, kafkatest.DebeziumVersion)
	p.signal(syscall.SIGTERM)
	p.exit(time.Minute)
}

// headerState renders a record's header k: absent, null, or =value.
func headerState(r *kgo.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			if h.Value == nil {
				return "null"
			}
			return "=" + string(h.Value)
		}
	}
	return "absent"
}
