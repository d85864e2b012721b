package config

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const debeziumProps = `# Debezium's outbox connector, as a Connect worker takes it
name=outbox-connector
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
plugin.name=pgoutput
database.hostname=db.internal
database.port=5433
database.user=dbz
database.password=s3cret
database.dbname=orders
database.sslmode=require
topic.prefix=orders
slot.name=outbox_slot
publication.name=outbox_pub
publication.autocreate.mode=filtered
table.include.list=public.outbox
heartbeat.interval.ms=10000
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.route.topic.replacement=events.${routedByValue}
transforms.outbox.table.fields.additional.placement=trace_id:header,\
  tenant:header:tenant,type:header:eventType
transforms.outbox.table.field.event.timestamp=created_at
transforms.outbox.table.op.invalid.behavior=warn
`

// TestDebeziumImport: a .properties configuration and the same as Kafka
// Connect's JSON give the same walrelay keys, which load back from the YAML
// written; the worker's properties give the brokers; the password is not
// copied and every option not mapped is named.
func TestDebeziumImport(t *testing.T) {
	props, err := ReadDebezium([]byte(debeziumProps))
	if err != nil {
		t.Fatal(err)
	}
	if got := props["transforms.outbox.table.fields.additional.placement"]; got != "trace_id:header,tenant:header:tenant,type:header:eventType" {
		t.Fatalf("a continued line: %q", got)
	}
	asJSON := `{"name": "outbox-connector", "config": {`
	first := true
	for k, v := range props {
		if !first {
			asJSON += ","
		}
		first = false
		asJSON += `"` + k + `": "` + strings.ReplaceAll(v, `\`, `\\`) + `"`
	}
	asJSON += "}}"
	fromJSON, err := ReadDebezium([]byte(asJSON))
	if err != nil {
		t.Fatal(err)
	}
	worker, _ := ReadDebezium([]byte("bootstrap.servers=k1:9092,k2:9092\ngroup.id=connect\noffset.storage.topic=connect-offsets\n"))
	for _, in := range []map[string]string{props, fromJSON} {
		keys, ignored, err := FromDebezium(in, worker)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			"postgres.dsn": "postgres://dbz@db.internal:5433/orders?sslmode=require", "postgres.slot": "outbox_slot", "postgres.publication": "outbox_pub",
			"postgres.table": "public.outbox", "heartbeat.interval": "10000ms", "kafka.topic": "events.{aggregatetype}",
			"outbox.header_columns": "trace_id,tenant,type:eventType", "outbox.timestamp_column": "created_at", "kafka.brokers": "k1:9092,k2:9092",
		}
		for k, v := range want {
			if keys[k] != v {
				t.Fatalf("%s = %q, want %q (all: %v)", k, keys[k], v, keys)
			}
		}
		notes := map[string]bool{}
		for _, n := range ignored {
			notes[n.Option] = true
			if strings.Contains(n.Why, "s3cret") {
				t.Fatalf("the password in a note: %+v", n)
			}
		}
		for _, o := range []string{"name", "tasks.max", "topic.prefix", "database.password", "group.id", "offset.storage.topic", "transforms.outbox.table.op.invalid.behavior"} {
			if !notes[o] {
				t.Fatalf("%s is not named among the ignored options: %+v", o, ignored)
			}
		}
		out, err := DebeziumYAML(keys)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "s3cret") {
			t.Fatalf("the password in the output:\n%s", out)
		}
		c := loadBack(t, out)
		if c.Postgres.Slot != "outbox_slot" || strings.Join(c.Kafka.Brokers, ",") != "k1:9092,k2:9092" || strings.Join(c.Outbox.HeaderColumns, ",") != "trace_id,tenant,type:eventType" || c.Kafka.Topic != "events.{aggregatetype}" {
			t.Fatalf("loaded back: %+v\n%s", c, out)
		}
		if l := c.OutboxConfig().Layout; strings.Join(l.HeaderColumns, ",") != "trace_id,tenant,type" || l.HeaderName("type") != "eventType" || l.HeaderName("tenant") != "tenant" {
			t.Fatalf("loaded back: %+v\n%s", c, out)
		}
	}
}

// TestDebeziumImportRefuses: every option whose behaviour walrelay does
// not reproduce is named, all at once; a configuration that is not an
// outbox connector is refused.
func TestDebeziumImportRefuses(t *testing.T) {
	props, _ := ReadDebezium([]byte(debeziumProps))
	props["value.converter"] = "io.confluent.connect.protobuf.ProtobufConverter" // Avro is mapped (TestDebeziumImportAvroConverter)
	props["transforms.outbox.route.topic.regex"] = "(?<routedByValue>(?!tmp).*)" // a lookahead: not in RE2
	props["transforms.outbox.table.fields.additional.placement"] = "shard:partition,shard2:partition,extra:envelope"
	props["transforms.outbox.table.expand.json.payload"] = "true"
	props["transforms.outbox.table.json.payload.null.behavior"] = "optional_bytes"
	props["column.mask.with.12.chars"] = "public.outbox.payload"
	props["some.future.option"] = "x"
	_, _, err := FromDebezium(props, nil)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, o := range []string{"value.converter:", "route.topic.regex:", "shard2:partition: a second partition column", "extra:envelope: walrelay writes the payload alone", "table.json.payload.null.behavior: optional_bytes", "column.mask.with.12.chars:", "some.future.option: an option walrelay does not know"} {
		if !strings.Contains(err.Error(), o) {
			t.Fatalf("%q not named in: %v", o, err)
		}
	}
	delete(props, "transforms")
	if _, _, err := FromDebezium(props, nil); err == nil || !strings.Contains(err.Error(), "not an outbox connector") {
		t.Fatalf("without the EventRouter: %v", err)
	}
	// Debezium's defaults: a slot named debezium, a publication of all
	// tables (walrelay uses its own), the JsonConverter.
	min, _ := ReadDebezium([]byte("connector.class=io.debezium.connector.postgresql.PostgresConnector\nplugin.name=pgoutput\ndatabase.dbname=app\n" +
		"key.converter=org.apache.kafka.connect.storage.StringConverter\nvalue.converter=org.apache.kafka.connect.storage.StringConverter\n" +
		"transforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n"))
	keys, ignored, err := FromDebezium(min, nil)
	if err != nil || keys["postgres.slot"] != "debezium" || keys["postgres.publication"] != "walrelay_outbox" || keys["kafka.topic"] != "outbox.event.{aggregatetype}" {
		t.Fatalf("defaults: %v, %v", keys, err)
	}
	found := false
	for _, n := range ignored {
		found = found || n.Option == "publication.autocreate.mode"
	}
	if !found {
		t.Fatalf("the all-tables publication not explained: %+v", ignored)
	}
}

// TestDebeziumImportJSONConverter: the JsonConverter maps onto the JSON
// formats, schemas.enable (default true) choosing the envelope.
func TestDebeziumImportJSONConverter(t *testing.T) {
	props, _ := ReadDebezium([]byte(debeziumProps))
	props["key.converter"] = "org.apache.kafka.connect.json.JsonConverter"
	props["value.converter"] = "org.apache.kafka.connect.json.JsonConverter"
	props["value.converter.schemas.enable"] = "false"
	keys, _, err := FromDebezium(props, nil)
	if err != nil || keys["kafka.key_format"] != "json_schema" || keys["kafka.value_format"] != "json" {
		t.Fatalf("%v, %v", keys, err)
	}
	// An expanded payload is a JSON object in Debezium's records:
	// kafka.expand_json_payload; with the StringConverter, Connect's Struct
	// text, refused.
	props["transforms.outbox.table.expand.json.payload"] = "true"
	if keys, _, err := FromDebezium(props, nil); err != nil || keys["kafka.expand_json_payload"] != "true" {
		t.Fatalf("an expanded payload with the JsonConverter: %v, %v", keys, err)
	}
	props["value.converter"] = "org.apache.kafka.connect.storage.StringConverter"
	if _, _, err := FromDebezium(props, nil); err == nil || !strings.Contains(err.Error(), "table.expand.json.payload: with the StringConverter") {
		t.Fatalf("an expanded payload with the StringConverter: %v, want a refusal", err)
	}
}

// TestDebeziumImportRouting: a topic regex with groups, a partition
// placement, tombstones for empty payloads and the trace context column are
// mapped, and the YAML loads back with them.
func TestDebeziumImportRouting(t *testing.T) {
	props, _ := ReadDebezium([]byte(debeziumProps))
	props["transforms.outbox.route.topic.regex"] = "(?<head>[a-z])(?<rest>[a-z]+)"
	props["transforms.outbox.route.topic.replacement"] = "events.${rest}.$1"
	props["transforms.outbox.table.fields.additional.placement"] = "shard:partition,version:header"
	props["transforms.outbox.route.tombstone.on.empty.payload"] = "true"
	props["transforms.outbox.tracing.span.context.field"] = "tracingspancontext"
	keys, _, err := FromDebezium(props, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DebeziumYAML(keys)
	if err != nil {
		t.Fatal(err)
	}
	c := loadBack(t, out)
	if c.Kafka.TopicRegex != "(?<head>[a-z])(?<rest>[a-z]+)" || c.Kafka.Topic != "events.${rest}.$1" || c.Outbox.PartitionColumn != "shard" ||
		strings.Join(c.Outbox.HeaderColumns, ",") != "version" || !c.Kafka.TombstoneOnEmpty || c.Outbox.TraceColumn != "tracingspancontext" {
		t.Fatalf("loaded back: %+v\n%s", c, out)
	}
	// The default regex with a replacement that uses more than
	// ${routedByValue} is routed by the regex too.
	props["transforms.outbox.route.topic.regex"] = "(?<routedByValue>.*)"
	props["transforms.outbox.route.topic.replacement"] = `cost\$.$1`
	if keys, _, err = FromDebezium(props, nil); err != nil || keys["kafka.topic_regex"] != "(?<routedByValue>.*)" || keys["kafka.topic"] != `cost\$.$1` {
		t.Fatalf("%v %v", keys, err)
	}
}

// loadBack loads the YAML an import printed as a configuration file.
func loadBack(t *testing.T, out string) *Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "walrelay.yaml")
	if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	cs := NewSet(flag.NewFlagSet("", flag.ContinueOnError))
	if err := cs.LoadFile(path); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	return cs.Config()
}

// TestDebeziumImportSeveralTables: a table.include.list of several tables
// becomes outbox.tables (one EventRouter: the same columns and topics for
// each), printed as a YAML list that loads back.
func TestDebeziumImportSeveralTables(t *testing.T) {
	props, _ := ReadDebezium([]byte(debeziumProps))
	props["table.include.list"] = "public.outbox, billing.outbox,audit_outbox"
	keys, _, err := FromDebezium(props, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := keys["postgres.table"]; ok {
		t.Fatalf("postgres.table set with several tables: %v", keys)
	}
	out, err := DebeziumYAML(keys)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "  tables:\n    - table: public.outbox\n    - table: billing.outbox\n    - table: public.audit_outbox\n") {
		t.Fatalf("outbox.tables not a YAML list:\n%s", out)
	}
	c := loadBack(t, out)
	if ls := c.OutboxConfig().Layouts(); len(ls) != 3 || ls[2].Name() != "public.audit_outbox" || ls[1].Columns.Payload != c.Outbox.PayloadColumn {
		t.Fatalf("loaded back: %+v\n%s", ls, out)
	}
	props["table.include.list"] = "public.outbox,billing.*"
	if _, _, err := FromDebezium(props, nil); err == nil || !strings.Contains(err.Error(), "not patterns") {
		t.Fatalf("a pattern: %v", err)
	}
}

// TestDebeziumImportAvroConverter: Apicurio's AvroConverter with
// Confluent's framing and content ids, and Confluent's, map onto the avro
// formats and kafka.schema_registry.* (the registry's Confluent-compatible
// URL, auto-registration, the basic auth user; the password never copied);
// what walrelay does not write is refused by name.
func TestDebeziumImportAvroConverter(t *testing.T) {
	apicurio := func() map[string]string {
		props, _ := ReadDebezium([]byte(debeziumProps))
		for _, side := range []string{"key", "value"} {
			c := side + ".converter"
			props[c] = "io.apicurio.registry.utils.converter.AvroConverter"
			props[c+".apicurio.registry.url"] = "http://registry:8080/apis/registry/v2"
			props[c+".apicurio.registry.auto-register"] = "true"
			props[c+".apicurio.registry.as-confluent"] = "true"
			props[c+".apicurio.registry.use-id"] = "contentId"
			props[c+".apicurio.registry.headers.enabled"] = "false"
			props[c+".apicurio.auth.username"] = "relay"
			props[c+".apicurio.auth.password"] = "pw-never-copied"
		}
		props["transforms.outbox.table.expand.json.payload"] = "true"
		return props
	}
	keys, ignored, err := FromDebezium(apicurio(), nil)
	if err != nil || keys["kafka.key_format"] != "avro" || keys["kafka.value_format"] != "avro" || keys["kafka.expand_json_payload"] != "true" ||
		keys["kafka.schema_registry.url"] != "http://registry:8080/apis/ccompat/v7" || keys["kafka.schema_registry.auto_register"] != "true" || keys["kafka.schema_registry.username"] != "relay" {
		t.Fatalf("Apicurio: %v, %v", keys, err)
	}
	for k, v := range keys {
		if strings.Contains(v, "pw-never-copied") {
			t.Errorf("%s copies the password", k)
		}
	}
	noted := false
	for _, n := range ignored {
		noted = noted || n.Option == "value.converter.apicurio.auth.password"
	}
	if !noted {
		t.Errorf("the password not explained: %+v", ignored)
	}
	out, err := DebeziumYAML(keys)
	if err != nil {
		t.Fatal(err)
	}
	if c := loadBack(t, out); c.Kafka.ValueFormat != "avro" || c.Kafka.SchemaRegistry.URL != "http://registry:8080/apis/ccompat/v7" {
		t.Errorf("read back: %+v", c.Kafka)
	}

	for _, bad := range []struct{ option, value, want string }{
		{"value.converter.apicurio.registry.as-confluent", "false", "value.converter.apicurio.registry.as-confluent: false: walrelay writes Confluent's framing"},
		{"value.converter.apicurio.registry.use-id", "globalId", "value.converter.apicurio.registry.use-id: globalId"},
		{"value.converter.apicurio.registry.headers.enabled", "true", "value.converter.apicurio.registry.headers.enabled: true: walrelay writes the schema id in the value"},
		{"value.converter.apicurio.registry.url", "http://registry:8080/apis/registry/v3", "value.converter.apicurio.registry.url: not Apicurio 2's API"},
		{"value.converter.apicurio.registry.artifact-resolver-strategy", "io.apicurio.registry.serde.strategy.RecordIdStrategy", "value.converter.apicurio.registry.artifact-resolver-strategy: an option walrelay does not know"},
		{"key.converter.apicurio.registry.url", "http://other:8080/apis/registry/v2", "the key and value converters name different schema registries"},
	} {
		props := apicurio()
		props[bad.option] = bad.value
		if _, _, err := FromDebezium(props, nil); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s=%s: %v, want %q", bad.option, bad.value, err, bad.want)
		}
	}
	// Apicurio's defaults: its own framing with global ids, refused.
	props := apicurio()
	delete(props, "value.converter.apicurio.registry.as-confluent")
	delete(props, "value.converter.apicurio.registry.use-id")
	delete(props, "value.converter.apicurio.registry.headers.enabled")
	if _, _, err := FromDebezium(props, nil); err == nil || !strings.Contains(err.Error(), "as-confluent: false") || !strings.Contains(err.Error(), "use-id: globalId") || !strings.Contains(err.Error(), "headers.enabled: true") {
		t.Errorf("Apicurio's defaults: %v, want both refused", err)
	}

	props, _ = ReadDebezium([]byte(debeziumProps))
	props["value.converter"] = "io.confluent.connect.avro.AvroConverter"
	props["value.converter.schema.registry.url"] = "https://sr.example:8081"
	props["value.converter.basic.auth.credentials.source"] = "USER_INFO"
	props["value.converter.basic.auth.user.info"] = "relay:pw-never-copied"
	keys, _, err = FromDebezium(props, nil)
	if err != nil || keys["kafka.value_format"] != "avro" || keys["kafka.key_format"] != "" || keys["kafka.schema_registry.url"] != "https://sr.example:8081" ||
		keys["kafka.schema_registry.auto_register"] != "true" || keys["kafka.schema_registry.username"] != "relay" {
		t.Fatalf("Confluent: %v, %v", keys, err)
	}
	props["value.converter.value.subject.name.strategy"] = "io.confluent.kafka.serializers.subject.RecordNameStrategy"
	props["value.converter.schema.registry.url"] = "https://u:p@sr.example:8081"
	_, _, err = FromDebezium(props, nil)
	if err == nil || !strings.Contains(err.Error(), "value.converter.value.subject.name.strategy: an option walrelay does not know") || !strings.Contains(err.Error(), "credentials in the URL") {
		t.Errorf("Confluent's subject strategy and a URL with credentials: %v", err)
	}
	if err != nil && (strings.Contains(err.Error(), "pw-never-copied") || strings.Contains(err.Error(), "u:p@")) {
		t.Errorf("the refusal shows a secret: %v", err)
	}
}

// TestDebeziumImportRefusesRegistryURLSecrets: Apicurio's
// apicurio.registry.url with credentials (http://relay:pw@registry...)
// was copied, password and all, into the YAML that walrelay debezium
// import prints, while Confluent's was refused (review44's
// TestProbe44DebeziumApicurioURLCredentials). Both converters' URLs are
// checked as kafka.schema_registry.url is (registry.CheckURL):
// credentials, a query or fragment (?access_token=...), a URL that is
// not http or https with a host are refused by option name, and neither
// the refusal nor any key copies the secret.
func TestDebeziumImportRefusesRegistryURLSecrets(t *testing.T) {
	const secret = "s3cret-pw"
	for _, c := range []struct{ converter, option, url, want string }{
		{"io.apicurio.registry.utils.converter.AvroConverter", "apicurio.registry.url", "http://relay:" + secret + "@registry:8080/apis/registry/v2", "credentials in the URL"},
		{"io.apicurio.registry.utils.converter.AvroConverter", "apicurio.registry.url", "http://" + secret + "@registry:8080/apis/registry/v2", "credentials in the URL"},
		{"io.apicurio.registry.utils.converter.AvroConverter", "apicurio.registry.url", "relay:" + secret + "@registry:8080/apis/registry/v2", "credentials in the URL"},
		{"io.apicurio.registry.utils.converter.AvroConverter", "apicurio.registry.url", "http://registry:8080/apis/registry/v2?access_token=" + secret, "a query or fragment in the URL"},
		{"io.apicurio.registry.utils.converter.AvroConverter", "apicurio.registry.url", "ftp://registry:8080/apis/registry/v2", "want an http or https URL"},
		{"io.confluent.connect.avro.AvroConverter", "schema.registry.url", "https://sr.example:8081/?access_token=" + secret, "a query or fragment in the URL"},
		{"io.confluent.connect.avro.AvroConverter", "schema.registry.url", "https://sr.example:8081#" + secret, "a query or fragment in the URL"},
	} {
		props, _ := ReadDebezium([]byte(debeziumProps))
		for _, side := range []string{"key", "value"} {
			cv := side + ".converter"
			props[cv] = c.converter
			props[cv+"."+c.option] = c.url
			if strings.HasPrefix(c.option, "apicurio.") {
				props[cv+".apicurio.registry.as-confluent"] = "true"
				props[cv+".apicurio.registry.use-id"] = "contentId"
				props[cv+".apicurio.registry.headers.enabled"] = "false"
			}
		}
		keys, _, err := FromDebezium(props, nil)
		if err == nil {
			out, _ := DebeziumYAML(keys)
			t.Errorf("%s=%s taken, want refused; the YAML:\n%s", c.option, c.url, out)
			continue
		}
		if want := "value.converter." + c.option + ": " + c.want; !strings.Contains(err.Error(), want) {
			t.Errorf("%s=%s: %v, want %q", c.option, c.url, err, want)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s=%s: the refusal prints the secret: %v", c.option, c.url, err)
		}
	}
}
