package format_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"

	"github.com/walrelay/walrelay/format"
)

// TestDecodeAvroBoundsRefuseHostileDatum: a datum of a few bytes whose
// block count, fixed size or nesting (in a schema a registry may hold)
// would make hamba/avro allocate gigabytes or recurse until the stack
// overflows (a fatal error that no recover catches: the consumer's
// process dies, again on the same record after each restart) is an error
// at once, whatever hamba/avro configuration decodes it.
func TestDecodeAvroBoundsRefuseHostileDatum(t *testing.T) {
	count := func(n int64, rest ...byte) []byte { return append(binary.AppendVarint(nil, n), rest...) }
	cases := []struct {
		name, schema string
		body         []byte
	}{
		{"array of null, 2^40 items", `{"type":"array","items":"null"}`, count(1<<40, 0)},
		{"array of empty record, 2^40 items", `{"type":"array","items":{"type":"record","name":"E","fields":[]}}`, count(1<<40, 0)},
		{"array of fixed 0, blocks of 2^30", `{"type":"array","items":{"type":"fixed","name":"F","size":0}}`, bytes.Repeat(count(1<<30), 8)},
		{"array of null, negative block count", `{"type":"array","items":"null"}`, count(-(1 << 40), 0, 0)},
		{"array of null, count -2^63", `{"type":"array","items":"null"}`, count(math.MinInt64, 0, 0)},
		{"map of null, 2^40 entries", `{"type":"map","values":"null"}`, count(1<<40, 0)},
		{"array of long, 2^40 items", `{"type":"array","items":"long"}`, count(1<<40, 0)},
		{"recursive record, 1 MiB of 0x02", `{"type":"record","name":"R","fields":[{"name":"r","type":["null","R"]}]}`, bytes.Repeat([]byte{2}, 1<<20)},
		{"recursive array, 1 MiB of 0x02", `{"type":"record","name":"A","fields":[{"name":"a","type":{"type":"array","items":"A"}}]}`, bytes.Repeat([]byte{2}, 1<<20)},
		{"record that contains itself", `{"type":"record","name":"S","fields":[{"name":"s","type":"S"}]}`, []byte{0}},
		{"fixed of 1e9, 1-byte body", `{"type":"fixed","name":"F","size":1000000000}`, []byte{0}},
		{"fixed of 2^31-1, 1-byte body", `{"type":"record","name":"R","fields":[{"name":"f","type":{"type":"fixed","name":"F","size":2147483647}}]}`, []byte{0}},
		{"string longer than the body", `"string"`, count(1<<40, 'a')},
		{"bytes of negative length", `"bytes"`, count(-5)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := format.ParseAvro(c.schema, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := format.DecodeAvroWith(avro.Config{}.Freeze(), s, c.body); !errors.Is(err, format.ErrAvroLimit) {
				t.Errorf("decode %d bytes in %s: %v, want ErrAvroLimit", len(c.body), c.schema, err)
			}
		})
	}
}

// TestDecodeAvroWithinBounds: what the bounds leave decodable: a datum
// that walrelay's avro format writes with a text of 2 MiB (beyond
// hamba/avro's default 1 MiB for a string), a linked list MaxAvroDepth deep, a few
// nulls in an array, a block with its byte size (a negative count).
func TestDecodeAvroWithinBounds(t *testing.T) {
	text := strings.Repeat("a", 2<<20)
	s, n, err := format.ValueSchema(format.Payload{Text: []byte(text), TextColumn: true})
	if err != nil {
		t.Fatal(err)
	}
	as, err := format.Avro(s)
	if err != nil {
		t.Fatal(err)
	}
	body, err := as.EncodeAvro(s, n)
	if err != nil {
		t.Fatal(err)
	}
	list := append(bytes.Repeat([]byte{2}, format.MaxAvroDepth-1), 0)
	cases := []struct {
		name, schema string
		body         []byte
	}{
		{"walrelay's own 2 MiB text", as.Text, body},
		{"linked list of MaxAvroDepth", `{"type":"record","name":"R","fields":[{"name":"r","type":["null","R"]}]}`, list},
		{"three nulls", `{"type":"array","items":"null"}`, []byte{6, 0}},
		{"block with its size", `{"type":"array","items":"long"}`, []byte{3, 4, 2, 4, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ps, err := format.ParseAvro(c.schema, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := format.DecodeAvroWith(format.AvroDecodeConfig(), ps, c.body); err != nil {
				t.Errorf("decode %s: %v", c.name, err)
			}
		})
	}
}
