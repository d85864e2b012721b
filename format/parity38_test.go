package format

import (
	"encoding/hex"
	"strings"
	"testing"
)

// TestAvroDebeziumParity38: the avro format against what Debezium 3.6.1
// writes (#38 review holes 5, 10), literals printed by
// testdata/debezium_avro_Probe.java.txt (run as TestAvroDebeziumParity
// says):
//   - an empty key whose value has a schema, at any depth: JsonSchemaData
//     throws (SchemaBuilderException: fieldName cannot be null), so the
//     EventRouter leaves the payload a string (an empty key whose value is
//     null or an empty array is left out, and the payload expands);
//   - Jackson's number length with an integer part of a single 0: the 0
//     is not counted when the number has a fraction or an exponent but not
//     both ("0." and 1000 nines, "0e" and 1000 ones are read and
//     expanded), it is counted with both.
func TestAvroDebeziumParity38(t *testing.T) {
	const (
		str = `["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]`
		dbl = `{"type":"record","name":"payload","fields":[{"name":"a","type":["null","double"],"default":null}],"connect.name":"payload"}`
	)
	nines, ones := strings.Repeat("9", 1000), strings.Repeat("1", 1000)
	for _, c := range []struct {
		name, payload, wantSchema, wantHex string
	}{
		{"empty key left a string", `{"":1}`, str, ""},
		{"nested empty key left a string", `{"a":{"":1}}`, str, ""},
		{"empty key in an array's object left a string", `{"a":[{"":1}]}`, str, ""},
		{"0. and 1000 nines expanded", `{"a":0.` + nines + `}`, dbl, "02000000000000f03f"},
		{"-0. and 1000 nines expanded", `{"a":-0.` + nines + `}`, dbl, "02000000000000f0bf"},
		{"0e and 1000 ones expanded", `{"a":0e` + ones + `}`, dbl, "020000000000000000"},
		{"0. and 1001 nines left a string", `{"a":0.` + nines + `9}`, str, ""},
		{"0.9e and 999 ones left a string", `{"a":0.9e` + ones[1:] + `}`, str, ""},
	} {
		body, schema, err := debeziumAvro(Payload{Text: []byte(c.payload), Column: "payload", Expand: true})
		if err != nil {
			t.Errorf("%s: %v; Debezium writes it (schema %s)", c.name, err, c.wantSchema)
			continue
		}
		if schema != c.wantSchema || c.wantHex != "" && hex.EncodeToString(body) != c.wantHex {
			t.Errorf("%s: schema %.120s bytes %.40s; Debezium: schema %.120s bytes %s", c.name, schema, hex.EncodeToString(body), c.wantSchema, c.wantHex)
		}
	}
}
