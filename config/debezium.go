package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/properties"
	"github.com/walrelay/walrelay/internal/sqlquote"
	"github.com/walrelay/walrelay/sink/record"
)

// Debezium's PostgreSQL connector with the outbox EventRouter, read as
// walrelay configuration (walrelay debezium import).

// DebeziumNote is what the import says of one Debezium option it did not
// map: ignored (it does not matter to walrelay, and Why says why) or
// refused (walrelay does not reproduce it). It names the option and never
// carries its value: an option walrelay does not know may hold a secret
// under any name (a JAAS configuration, a keystore password, a token).
type DebeziumNote struct {
	Option, Why string
}

// DebeziumRefused is FromDebezium's error when walrelay does not
// reproduce some options: each with why, one a line.
type DebeziumRefused struct {
	Refused []DebeziumNote
}

func (e *DebeziumRefused) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "walrelay does not reproduce %d option(s) of this configuration, so no YAML was written (change or remove each in the connector's configuration and import again):", len(e.Refused))
	for _, n := range e.Refused {
		b.WriteString("\n  " + n.Option + ": " + n.Why)
	}
	return b.String()
}

const (
	debeziumConnector = "io.debezium.connector.postgresql.PostgresConnector"
	eventRouter       = "io.debezium.transforms.outbox.EventRouter"
	stringConverter   = "org.apache.kafka.connect.storage.StringConverter"
	jsonConverter     = "org.apache.kafka.connect.json.JsonConverter"
	apicurioAvro      = "io.apicurio.registry.utils.converter.AvroConverter"
	confluentAvro     = "io.confluent.connect.avro.AvroConverter"
	// Debezium's Avro recipe for the outbox: a bytea payload that the
	// application framed, passed through.
	binaryConverter    = "io.debezium.converters.BinaryDataConverter"
	byteArrayConverter = "org.apache.kafka.connect.converters.ByteArrayConverter"
	// Kafka Connect's default header converter.
	simpleHeaderConverter = "org.apache.kafka.connect.storage.SimpleHeaderConverter"
	defaultRegex          = "(?<routedByValue>.*)"
)

// ReadDebezium parses a connector or worker configuration: a .properties
// file, or the JSON of Kafka Connect's REST API ({"name":…, "config":{…}}
// or the bare map).
func ReadDebezium(data []byte) (map[string]string, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		var doc map[string]any
		if err := json.Unmarshal(trimmed, &doc); err != nil {
			return nil, fmt.Errorf("JSON: %w", err)
		}
		if c, ok := doc["config"].(map[string]any); ok {
			doc = c
		}
		out := map[string]string{}
		for k, v := range doc {
			switch v := v.(type) {
			case string:
				out[k] = v
			case float64, bool:
				out[k] = fmt.Sprint(v)
			default:
				return nil, fmt.Errorf("option %s: a %T, want a string", k, v)
			}
		}
		return out, nil
	}
	return properties.Parse(data)
}

// debeziumIgnored are options that do not change what walrelay must do,
// by prefix (a trailing dot) or by name, with why.
var debeziumIgnored = []struct{ option, why string }{
	{"name", "the connector's name in Kafka Connect"},
	{"tasks.max", "a Kafka Connect setting (the PostgreSQL connector runs one task)"},
	{"topic.prefix", "names Debezium's own topics (the table's change topic before routing, heartbeats); the outbox events are routed by route.topic.replacement"},
	{"database.server.name", "names Debezium's own topics (older versions of topic.prefix)"},
	{"snapshot.mode", "walrelay does not snapshot: it relays what the slot captures, as snapshot.mode=never does, which is what an outbox needs (old events are not sent again)"},
	{"snapshot.", "walrelay does not snapshot"},
	{"slot.drop.on.stop", "walrelay never drops its slot"},
	{"slot.max.retries", "walrelay retries without limit, with backoff"},
	{"slot.retry.delay.ms", "walrelay retries with its own backoff"},
	{"status.update.interval.ms", "postgres.status_interval (default 1s) plays this part"},
	{"heartbeat.action.query", "walrelay's heartbeat writes a logical decoding message itself (heartbeat.interval)"},
	{"heartbeat.topics.prefix", "walrelay writes no heartbeat topic"},
	{"tombstones.on.delete", "walrelay's publication publishes inserts only: deleting an outbox row sends nothing"},
	{"decimal.handling.mode", "the payload is relayed as stored, not converted column by column"},
	{"time.precision.mode", "the payload is relayed as stored"},
	{"binary.handling.mode", "the payload is relayed as stored"},
	{"hstore.handling.mode", "the payload is relayed as stored"},
	{"interval.handling.mode", "the payload is relayed as stored"},
	{"include.unknown.datatypes", "the payload is relayed as stored"},
	{"max.batch.size", "batching is walrelay's own (kafka.linger, kafka.batch_max_bytes)"},
	{"max.queue.size", "buffering is walrelay's own (kafka.max_buffered_records)"},
	{"max.queue.size.in.bytes", "buffering is walrelay's own (kafka.max_buffered_bytes)"},
	{"poll.interval.ms", "walrelay streams without polling"},
	{"provide.transaction.metadata", "walrelay writes no transaction topic; each record carries walrelay.lsn and walrelay.xid"},
	{"errors.", "Kafka Connect's error handling: walrelay dead-letters an event it cannot publish (kafka.dlq_topic) and never skips one"},
	{"offset.", "walrelay keeps its position in the slot"},
	{"producer.override.", "producer tuning: walrelay's kafka.* keys set its producer"},
	{"database.history.", "schema history is not used by the PostgreSQL connector"},
	{"schema.history.internal.", "schema history is not used by the PostgreSQL connector"},
	{"database.tcpKeepAlive", "walrelay's connections keep themselves alive"},
	{"database.initial.statements", "walrelay's sessions set their own parameters"},
	{"skipped.operations", "walrelay's publication publishes inserts only"},
	{"event.processing.failure.handling.mode", "walrelay dead-letters an event it cannot publish, or stops"},
	{"key.converter.schemas.enable", "read with key.converter"},
	{"value.converter.schemas.enable", "read with value.converter"},
	{"group.id", "a Kafka Connect worker setting"},
	{"config.storage.", "a Kafka Connect worker setting"},
	{"status.storage.", "a Kafka Connect worker setting"},
	{"plugin.path", "a Kafka Connect worker setting"},
	{"rest.", "a Kafka Connect worker setting"},
	{"listeners", "a Kafka Connect worker setting"},
	{"internal.", "a Kafka Connect worker setting"},
	{"offset.flush.interval.ms", "walrelay confirms positions itself (postgres.status_interval)"},
	{"transforms.", "read with transforms"},
	{"database.password", "not copied: give it in postgres.password_file, or in WALRELAY_POSTGRES_DSN"},
	{"database.sslpassword", "not copied: give it in WALRELAY_POSTGRES_DSN"},
	{"security.protocol", "read with bootstrap.servers"},
	{"sasl.jaas.config", "read with sasl.mechanism (the password is not copied)"},
}

func ignoredWhy(option string) (string, bool) {
	for _, ig := range debeziumIgnored {
		if ig.option == option || strings.HasSuffix(ig.option, ".") && strings.HasPrefix(option, ig.option) {
			return ig.why, true
		}
	}
	return "", false
}

// FromDebezium maps a Debezium PostgreSQL connector configuration with the
// outbox EventRouter onto walrelay's configuration keys. worker, if set, is
// the Kafka Connect worker's configuration (bootstrap servers, default
// converters), which the connector's options override. It returns the keys
// to set, the options it ignored with why, and an error that names every
// option it refuses (whose behaviour walrelay does not reproduce).
func FromDebezium(connector, worker map[string]string) (keys map[string]string, ignored []DebeziumNote, err error) {
	// Kafka Connect configures a converter from one file alone: the
	// connector's if it names the converter (key.converter,
	// value.converter), else the worker's (Plugins.newConverter, the
	// converter.* settings of that file). The other file's settings of
	// that converter do not apply: noted, not read.
	inConnector := map[string]bool{}
	for _, cv := range converterOptions {
		_, inConnector[cv] = connector[cv]
	}
	opt := map[string]string{}
	for k, v := range worker {
		if cv := converterOf(k); cv != "" && inConnector[cv] {
			ignored = append(ignored, DebeziumNote{k, "the connector sets " + cv + ": Kafka Connect configures it from the connector's " + cv + ".* alone, not the worker's"})
			continue
		}
		opt[k] = v
	}
	for k, v := range connector {
		if cv := converterOf(k); cv != "" && !inConnector[cv] {
			ignored = append(ignored, DebeziumNote{k, "the connector does not set " + cv + ": Kafka Connect configures the worker's from the worker's " + cv + ".* alone, not the connector's"})
			continue
		}
		opt[k] = v
	}
	keys = map[string]string{}
	used := map[string]bool{}
	var refused []DebeziumNote
	refuse := func(option, why string) {
		refused = append(refused, DebeziumNote{option, why}) // the value left out: it may be a secret
		used[option] = true
	}
	// sqlName refuses a table or column name walrelay could not write
	// into SQL as it is ('$', a control character, longer than
	// PostgreSQL keeps): walrelay migrate writes it into DDL.
	sqlName := func(option, v string) bool {
		if err := sqlquote.CheckName(v); err != nil {
			refuse(option, "walrelay writes this name into SQL and refuses it: "+err.Error())
			return false
		}
		return true
	}
	get := func(option, def string) string {
		used[option] = true
		if v, ok := opt[option]; ok && v != "" {
			return v
		}
		return def
	}

	if c := get("connector.class", ""); c != debeziumConnector {
		return nil, nil, fmt.Errorf("connector.class %q: want %s (Debezium's PostgreSQL connector)", c, debeziumConnector)
	}
	if p := get("plugin.name", "decoderbufs"); p != "pgoutput" {
		refuse("plugin.name", p+": walrelay reads pgoutput only (plugin.name defaults to decoderbufs in Debezium)")
	}

	// The connection.
	host, port, user, db := get("database.hostname", "localhost"), get("database.port", "5432"), get("database.user", ""), get("database.dbname", "")
	if db == "" {
		return nil, nil, errors.New("database.dbname is not set")
	}
	u := url.URL{Scheme: "postgres", Host: host + ":" + port, Path: "/" + db}
	if user != "" {
		u.User = url.User(user)
	}
	q := url.Values{}
	for _, p := range []struct{ option, param string }{{"database.sslmode", "sslmode"}, {"database.sslrootcert", "sslrootcert"}, {"database.sslcert", "sslcert"}, {"database.sslkey", "sslkey"}} {
		if v := get(p.option, ""); v != "" {
			q.Set(p.param, v)
		}
	}
	u.RawQuery = q.Encode()
	keys["postgres.dsn"] = u.String()
	if _, ok := opt["database.password"]; !ok {
		ignored = append(ignored, DebeziumNote{"database.password", "not set: give the password in postgres.password_file, or in WALRELAY_POSTGRES_DSN"})
	}

	// The slot and the publication: Debezium's defaults when unset, so that
	// walrelay can take over Debezium's own slot.
	keys["postgres.slot"] = get("slot.name", "debezium")
	pub := get("publication.name", "dbz_publication")
	switch mode := get("publication.autocreate.mode", "all_tables"); mode {
	case "filtered", "disabled", "no_tables":
		keys["postgres.publication"] = pub
	default:
		keys["postgres.publication"] = "walrelay_outbox"
		ignored = append(ignored, DebeziumNote{"publication.autocreate.mode",
			fmt.Sprintf(mode+": Debezium's publication %s publishes every table, which walrelay does not read (every change of every table would be decoded and sent); "+
				"walrelay uses walrelay_outbox: create it with walrelay publication create while Debezium still runs on slot %s, "+
				"then wait until walrelay check says OK for the slot (its position is then past the publication's creation), then stop Debezium and start walrelay run "+
				"(docs/debezium.md, \"Switching\")", pub, keys["postgres.slot"])})
	}

	// The outbox table.
	if v := get("table.include.list", ""); v != "" {
		var tables []OutboxTable
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); !strings.Contains(t, ".") {
				t = "public." + t
			}
			schema, table, _ := strings.Cut(t, ".")
			if !sqlName("table.include.list", schema) || !sqlName("table.include.list", table) {
				continue
			}
			tables = append(tables, OutboxTable{Table: t})
		}
		switch {
		case strings.ContainsAny(v, `*+?[](){}|^$\`):
			refuse("table.include.list", "walrelay relays outbox tables named exactly (schema.table), not patterns")
		case len(tables) == 0:
		case len(tables) == 1:
			keys["postgres.table"] = tables[0].Table
		default:
			// One EventRouter for all: the same columns and topics.
			keys["outbox.tables"] = tablesJSON(tables)
		}
	}
	for _, o := range []string{"table.exclude.list", "schema.exclude.list", "column.include.list", "column.exclude.list", "message.key.columns", "column.mask.", "column.truncate."} {
		for k := range opt {
			if k == o || strings.HasSuffix(o, ".") && strings.HasPrefix(k, o) {
				refuse(k, "walrelay relays the outbox's rows whole")
			}
		}
	}
	if v := get("schema.include.list", ""); v != "" && keys["postgres.table"] == "" && keys["outbox.tables"] == "" {
		refuse("schema.include.list", "give table.include.list: walrelay relays outbox tables named exactly")
	}
	if v := get("heartbeat.interval.ms", ""); v != "" && v != "0" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms < 0 {
			refuse("heartbeat.interval.ms", "not a number of milliseconds")
		} else {
			keys["heartbeat.interval"] = fmt.Sprintf("%dms", ms)
		}
	}

	// The converters: the StringConverter's bytes, or the JsonConverter's
	// JSON (schemas.enable defaults to true).
	for _, side := range []string{"key", "value"} {
		option := side + ".converter"
		switch c := get(option, ""); c {
		case stringConverter:
		case jsonConverter:
			if get(option+".schemas.enable", "true") == "true" {
				keys["kafka."+side+"_format"] = "json_schema"
			} else {
				keys["kafka."+side+"_format"] = "json"
			}
		case apicurioAvro, confluentAvro:
			keys["kafka."+side+"_format"] = "avro"
			registryFromDebezium(option, c == apicurioAvro, get, refuse, keys, &ignored)
		case binaryConverter, byteArrayConverter:
			if side == "key" {
				refuse(option, "the key is the aggregate id's text, which "+c+" does not take")
				break
			}
			ignored = append(ignored, DebeziumNote{option, c + ": the bytea payload is published as it is (kafka.value_format raw); kafka.value_format registry_passthrough with kafka.schema_registry.url also checks its Confluent framing and that its schema id is a version of <topic>-value (kafka.schema_registry.subject_strategy; docs/schema-registry.md)"})
			for k := range opt {
				if strings.HasPrefix(k, option+".delegate.converter.type") {
					used[k] = true
					ignored = append(ignored, DebeziumNote{k, "the delegate converts values that are not bytes: the payload column is bytea"})
				}
			}
		case "":
			refuse(option, "not set: give the worker's configuration (--worker FILE), where Kafka Connect's default converter is set")
		default:
			refuse(option, fmt.Sprintf("walrelay writes the %s as the StringConverter, the JsonConverter or an AvroConverter (Apicurio's, Confluent's) does; %s is not reproduced", side, c))
		}
	}

	// The header converter: Kafka Connect's default writes the
	// EventRouter's header fields as walrelay does (a string's UTF-8
	// bytes); another (the JsonConverter's quoted strings) does not.
	if c := get("header.converter", simpleHeaderConverter); c != simpleHeaderConverter {
		refuse("header.converter", fmt.Sprintf("walrelay writes headers as the SimpleHeaderConverter (Kafka Connect's default) does; %s is not reproduced", c))
	}

	// Kafka.
	// Without bootstrap.servers (in the worker's configuration) the keys
	// lack kafka.brokers: the caller says so (walrelay debezium import).
	if v := get("bootstrap.servers", ""); v != "" {
		keys["kafka.brokers"] = v
	}
	switch sp := get("security.protocol", "PLAINTEXT"); sp {
	case "PLAINTEXT":
	case "SSL", "SASL_SSL", "SASL_PLAINTEXT":
		if sp != "SASL_PLAINTEXT" {
			keys["kafka.tls.enabled"] = "true"
			ignored = append(ignored, DebeziumNote{"security.protocol", sp + ": TLS on: give the CA as PEM in kafka.tls.ca_file (walrelay reads no Java keystore)"})
		}
		if strings.HasPrefix(sp, "SASL") {
			mech := get("sasl.mechanism", "GSSAPI")
			if mech == "PLAIN" || mech == "SCRAM-SHA-256" || mech == "SCRAM-SHA-512" {
				keys["kafka.sasl.mechanism"] = mech
				if m := jaasUser.FindStringSubmatch(get("sasl.jaas.config", "")); m != nil {
					keys["kafka.sasl.username"] = m[1]
				}
				ignored = append(ignored, DebeziumNote{"sasl.jaas.config", "the password is not copied: give it in kafka.sasl.password_file or WALRELAY_KAFKA_SASL_PASSWORD"})
			} else {
				refuse("sasl.mechanism", mech+": walrelay speaks PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512")
			}
		}
	default:
		refuse("security.protocol", sp+": unknown")
	}
	for k := range opt {
		if strings.HasPrefix(k, "ssl.") {
			ignored = append(ignored, DebeziumNote{k, "Java keystores are not read: give PEM files in kafka.tls.*"})
			used[k] = true
		}
	}

	// The EventRouter.
	var router string
	for _, t := range strings.Split(get("transforms", ""), ",") {
		t = strings.TrimSpace(t)
		if t == "" {
			continue
		}
		if typ := get("transforms."+t+".type", ""); typ == eventRouter && router == "" {
			router = t
		} else {
			refuse("transforms."+t+".type", "walrelay runs no other transformation than the outbox EventRouter's")
		}
	}
	if router == "" {
		return nil, nil, errors.New("no transform of type io.debezium.transforms.outbox.EventRouter: this is not an outbox connector")
	}
	pre := "transforms." + router + "."
	r := func(option, def string) string { return get(pre+option, def) }
	for option, key := range map[string]string{
		"table.field.event.id": "outbox.id_column", "table.field.event.key": "outbox.aggregate_id_column",
		"table.field.event.type": "outbox.type_column", "table.field.event.payload": "outbox.payload_column",
		"route.by.field": "outbox.aggregate_type_column", "table.field.event.timestamp": "outbox.timestamp_column",
	} {
		if v := r(option, ""); v != "" && sqlName(pre+option, v) {
			keys[key] = v
		}
	}
	if v := r("table.field.event.schema.version", ""); v != "" {
		refuse(pre+"table.field.event.schema.version", "walrelay writes no Connect schema")
	}
	// The default regex and a replacement with ${routedByValue} alone are
	// a topic template; anything else is routed by the regex as Debezium
	// routes it (kafka.topic_regex).
	regex, repl := r("route.topic.regex", defaultRegex), r("route.topic.replacement", "outbox.event.${routedByValue}")
	template := strings.ReplaceAll(repl, "${routedByValue}", "{aggregatetype}")
	if regex != defaultRegex || strings.ContainsAny(template, `$\`) {
		if err := record.CheckRouting(repl, regex); err != nil {
			refuse(pre+"route.topic.regex", err.Error())
		} else {
			keys["kafka.topic_regex"], keys["kafka.topic"] = regex, repl
		}
	} else {
		keys["kafka.topic"] = template
	}
	switch v := r("route.tombstone.on.empty.payload", "false"); v {
	case "true":
		keys["kafka.tombstone_on_empty_payload"] = "true"
	case "false":
	default:
		refuse(pre+"route.tombstone.on.empty.payload", "want true or false")
	}
	switch v := r("table.expand.json.payload", "false"); v {
	case "true":
		if get("value.converter", "") == stringConverter {
			refuse(pre+"table.expand.json.payload", "with the StringConverter Debezium writes the expanded payload as Kafka Connect's Struct text, which walrelay does not reproduce")
			break
		}
		keys["kafka.expand_json_payload"] = "true"
		for _, o := range []struct{ option, def string }{{"table.json.payload.null.behavior", "ignore"}, {"table.json.payload.empty.array.behavior", "ignore"}} {
			if v := strings.ToLower(r(o.option, o.def)); v != o.def {
				refuse(pre+o.option, fmt.Sprintf("%s: walrelay expands a payload as Debezium does by default (%s: such fields left out)", v, o.def))
			}
		}
		if v := get("field.name.adjustment.mode", "none"); v != "none" {
			refuse("field.name.adjustment.mode", fmt.Sprintf("%s: walrelay expands a payload with its field names as they are (none)", v))
		}
	case "false":
	default:
		refuse(pre+"table.expand.json.payload", "want true or false")
	}
	var headers []string
	for _, p := range strings.Split(r("table.fields.additional.placement", ""), ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		f := strings.Split(p, ":")
		switch {
		case !sqlName(pre+"table.fields.additional.placement", f[0]):
		case len(f) >= 2 && f[1] == "header" && (len(f) == 2 || f[2] == f[0]):
			headers = append(headers, f[0])
		case len(f) == 3 && f[1] == "header" && f[2] != "":
			headers = append(headers, f[0]+":"+f[2]) // the header's own name
		case len(f) >= 2 && f[1] == "header":
			refuse(pre+"table.fields.additional.placement", fmt.Sprintf("%s: want column:header or column:header:name", p))
		case len(f) >= 2 && f[1] == "partition" && keys["outbox.partition_column"] == "":
			keys["outbox.partition_column"] = f[0]
		case len(f) >= 2 && f[1] == "partition":
			refuse(pre+"table.fields.additional.placement", fmt.Sprintf("%s: a second partition column (Debezium uses the last)", p))
		default:
			refuse(pre+"table.fields.additional.placement", fmt.Sprintf("%s: walrelay writes the payload alone as the value, with no envelope of extra fields", p))
		}
	}
	if len(headers) > 0 {
		keys["outbox.header_columns"] = strings.Join(headers, ",")
	}
	if v := r("tracing.span.context.field", ""); v != "" && sqlName(pre+"tracing.span.context.field", v) {
		keys["outbox.trace_column"] = v
	}
	for option, why := range map[string]string{
		"table.op.invalid.behavior":                "walrelay's publication publishes inserts only: an update or delete of the outbox never reaches it",
		"table.fields.additional.error.on.missing": "walrelay refuses at start an outbox without a configured header column",
		"tracing.operation.name":                   "walrelay passes the writer's trace context on (outbox.trace_column); its own spans (tracing.enabled) have fixed names and start only from a row's context",
		"tracing.with.context.field.only":          "walrelay passes the writer's trace context on (outbox.trace_column); its own spans (tracing.enabled) have fixed names and start only from a row's context",
		"type":                                     "the EventRouter",
	} {
		if _, ok := opt[pre+option]; ok {
			used[pre+option] = true
			if option != "type" {
				ignored = append(ignored, DebeziumNote{pre + option, why})
			}
		}
	}

	// Every other option: ignored with why, or refused as unknown.
	var rest []string
	for k := range opt {
		if !used[k] {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	for _, k := range rest {
		_, fromWorker := worker[k]
		_, fromConnector := connector[k]
		switch why, ok := ignoredWhy(k); {
		case strings.HasPrefix(k, pre):
			refuse(k, "an EventRouter option walrelay does not reproduce")
		case ok:
			ignored = append(ignored, DebeziumNote{k, why})
		case converterOf(k) != "":
			// A setting of the converter, from the file it is configured
			// from (the worker's or the connector's) that walrelay does
			// not map: it may change the records (Apicurio's
			// avro.encoding=JSON, an artifact resolver strategy).
			refuse(k, "an option walrelay does not know: it may change the records")
		case fromWorker && !fromConnector:
			ignored = append(ignored, DebeziumNote{k, "a Kafka Connect worker setting"})
		default:
			refuse(k, "an option walrelay does not know: it may change the records")
		}
	}
	sort.Slice(ignored, func(i, j int) bool { return ignored[i].Option < ignored[j].Option })
	if len(refused) > 0 {
		sort.Slice(refused, func(i, j int) bool { return refused[i].Option+refused[i].Why < refused[j].Option+refused[j].Why })
		return nil, ignored, &DebeziumRefused{Refused: refused}
	}
	return keys, ignored, nil
}

// converterOptions name Kafka Connect's key, value and header converters.
var converterOptions = []string{"key.converter", "value.converter", "header.converter"}

// converterOf is the converter option (key.converter, value.converter,
// header.converter) that option is or is a setting of, "" if none.
func converterOf(option string) string {
	for _, cv := range converterOptions {
		if option == cv || strings.HasPrefix(option, cv+".") {
			return cv
		}
	}
	return ""
}

// registryURLWhy says why a converter's registry URL is refused, "" if it
// is not: walrelay would refuse it at load as it refuses
// kafka.schema_registry.url (registry.CheckURL), and the import
// would have printed it, credentials and all, in the YAML the operator
// keeps. The reason never quotes the URL.
func registryURLWhy(u string) string {
	// Any '@' first: "user:pw@registry:8081" without its scheme is not
	// a URL with a user to registry.CheckURL, but its password all the same.
	if strings.Contains(u, "@") {
		return "credentials in the URL: give the user in kafka.schema_registry.username and the password in kafka.schema_registry.password_file"
	}
	switch err := registry.CheckURL(u); {
	case errors.Is(err, registry.ErrURLQuery):
		return "a query or fragment in the URL (?… or #…, a token as ?access_token= too), which errors would print: give credentials in kafka.schema_registry.username and kafka.schema_registry.password_file, or a client certificate in kafka.schema_registry.tls_cert_file and kafka.schema_registry.tls_key_file"
	case err != nil:
		return "want an http or https URL with a host (http://host:port/path)"
	}
	return ""
}

// registryFromDebezium maps the settings of an AvroConverter (Apicurio's
// if apicurio, else Confluent's) at option (key.converter,
// value.converter) onto kafka.schema_registry.*: the URL, auto-registration
// and the basic auth user (the password is not copied). Apicurio's must
// write Confluent's framing with content ids in the value
// (as-confluent=true, use-id=contentId, headers.enabled=false), what
// walrelay writes; its other settings, and
// Confluent's other than these, are refused as unknown options (they may
// change the records). Key and value converters must name one registry.
func registryFromDebezium(option string, apicurio bool, get func(string, string) string, refuse func(string, string), keys map[string]string, ignored *[]DebeziumNote) {
	set := func(key, v, from string) {
		if old, ok := keys[key]; ok && old != v {
			refuse(from, fmt.Sprintf("the key and value converters name different schema registries or settings (%s): walrelay has one", key))
			return
		}
		keys[key] = v
	}
	p := option + "."
	if apicurio {
		u := get(p+"apicurio.registry.url", "")
		switch {
		case u == "":
			refuse(p+"apicurio.registry.url", "not set")
		case registryURLWhy(u) != "":
			refuse(p+"apicurio.registry.url", registryURLWhy(u))
		case strings.HasSuffix(strings.TrimSuffix(u, "/"), "/apis/registry/v2"):
			// walrelay speaks Confluent's API, which Apicurio 2 serves
			// beside its own.
			set("kafka.schema_registry.url", strings.TrimSuffix(strings.TrimSuffix(u, "/"), "/apis/registry/v2")+"/apis/ccompat/v7", p+"apicurio.registry.url")
		default:
			refuse(p+"apicurio.registry.url", "not Apicurio 2's API (…/apis/registry/v2): give walrelay the registry's Confluent-compatible URL in kafka.schema_registry.url")
		}
		if v := get(p+"apicurio.registry.as-confluent", "false"); v != "true" {
			refuse(p+"apicurio.registry.as-confluent", v+": walrelay writes Confluent's framing (magic byte 0, a 4-byte id), as-confluent=true; Apicurio's own framing (an 8-byte id) is not reproduced")
		}
		if v := get(p+"apicurio.registry.headers.enabled", "true"); v != "false" {
			refuse(p+"apicurio.registry.headers.enabled", v+": walrelay writes the schema id in the value (headers.enabled=false); Apicurio's id in a record header is not reproduced")
		}
		if v := get(p+"apicurio.registry.use-id", "globalId"); v != "contentId" {
			refuse(p+"apicurio.registry.use-id", v+": walrelay frames the id Confluent's API gives, Apicurio's content id (use-id=contentId)")
		}
		auto := get(p+"apicurio.registry.auto-register", "false")
		if auto != "true" && auto != "false" {
			refuse(p+"apicurio.registry.auto-register", "want true or false")
		} else {
			set("kafka.schema_registry.auto_register", auto, p+"apicurio.registry.auto-register")
		}
		if user := get(p+"apicurio.auth.username", ""); user != "" {
			set("kafka.schema_registry.username", user, p+"apicurio.auth.username")
		}
		if get(p+"apicurio.auth.password", "") != "" {
			*ignored = append(*ignored, DebeziumNote{p + "apicurio.auth.password", "the password is not copied: give it in kafka.schema_registry.password_file or WALRELAY_KAFKA_SCHEMA_REGISTRY_PASSWORD"})
		}
		return
	}
	u := get(p+"schema.registry.url", "")
	switch {
	case u == "":
		refuse(p+"schema.registry.url", "not set")
	case strings.Contains(u, ","):
		refuse(p+"schema.registry.url", "several URLs: walrelay takes one")
	case registryURLWhy(u) != "":
		refuse(p+"schema.registry.url", registryURLWhy(u))
	default:
		set("kafka.schema_registry.url", u, p+"schema.registry.url")
	}
	auto := get(p+"auto.register.schemas", "true")
	if auto != "true" && auto != "false" {
		refuse(p+"auto.register.schemas", "want true or false")
	} else {
		set("kafka.schema_registry.auto_register", auto, p+"auto.register.schemas")
	}
	switch src := get(p+"basic.auth.credentials.source", "URL"); src {
	case "URL":
	case "USER_INFO":
		info := get(p+"basic.auth.user.info", get(p+"schema.registry.basic.auth.user.info", ""))
		if user, _, ok := strings.Cut(info, ":"); ok && user != "" {
			set("kafka.schema_registry.username", user, p+"basic.auth.user.info")
			*ignored = append(*ignored, DebeziumNote{p + "basic.auth.user.info", "the password is not copied: give it in kafka.schema_registry.password_file or WALRELAY_KAFKA_SCHEMA_REGISTRY_PASSWORD"})
		} else {
			refuse(p+"basic.auth.user.info", "want user:password")
		}
	default:
		refuse(p+"basic.auth.credentials.source", src+": walrelay takes USER_INFO (HTTP basic auth)")
	}
}

var jaasUser = regexp.MustCompile(`username\s*=\s*"([^"]*)"`)
