package format_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/format"
)

// TestParseAvroRefusesDecimalBeyondBound (review43a's
// TestProbeAvroDecimalScaleUnbounded): hamba/avro computes 10^scale for
// every decimal it decodes, so a registry's schema of scale 10^7 made a
// 2-byte datum take seconds of CPU (scale 2^31-1: hours). ParseAvro
// refuses a decimal beyond MaxAvroDecimalPrecision (ErrAvroDecimal: the
// inbox's undecodable), and one at the bound decodes at once.
func TestParseAvroRefusesDecimalBeyondBound(t *testing.T) {
	for _, c := range []struct {
		schema string
		ok     bool
	}{
		{`{"type":"bytes","logicalType":"decimal","precision":10000000,"scale":10000000}`, false},
		{`{"type":"bytes","logicalType":"decimal","precision":2147483647,"scale":2147483647}`, false},
		{`{"type":"bytes","logicalType":"decimal","precision":1001,"scale":2}`, false},
		{`{"type":"record","name":"R","fields":[{"name":"f","type":["null",{"type":"bytes","logicalType":"decimal","precision":2000,"scale":2000}]}]}`, false},
		{`{"type":"array","items":{"type":"bytes","logicalType":"decimal","precision":5000,"scale":0}}`, false},
		{fmt.Sprintf(`{"type":"bytes","logicalType":"decimal","precision":%d,"scale":%d}`, format.MaxAvroDecimalPrecision, format.MaxAvroDecimalPrecision), true},
		{`{"type":"bytes","logicalType":"decimal","precision":38,"scale":9}`, true},
	} {
		s, err := format.ParseAvro(c.schema, nil)
		if !c.ok {
			if !errors.Is(err, format.ErrAvroDecimal) {
				t.Errorf("ParseAvro(%.90s): %v, want ErrAvroDecimal", c.schema, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseAvro(%s): %v", c.schema, err)
			continue
		}
		start := time.Now()
		if _, err := format.DecodeAvroWith(format.AvroDecodeConfig(), s, []byte{2, 1}); err != nil {
			t.Errorf("decode a 2-byte datum of %s: %v", c.schema, err)
		}
		if took := time.Since(start); took > 100*time.Millisecond {
			t.Errorf("a 2-byte datum of %s took %v", c.schema, took)
		}
	}
}

// TestJSONSchemaCheckRefusesHugeNumbers (review43a's
// TestProbeJSONSchemaHugeExponentCPU): the validator reads numbers with
// math/big, 1e999999 in some 20 ms (twice for "integer" and "minimum"):
// 30 of them, 279 bytes, held a registered_jsonschema stream (or an inbox
// partition with ValidateJSON) for seconds, a 1 MiB payload for hours. A
// number beyond MaxJSONNumberDigits or MaxJSONNumberExponent is refused
// at once; a payload of numbers at the bounds is checked in a time
// of the order of one of real values (1e308: a double), and real values are valid.
func TestJSONSchemaCheckRefusesHugeNumbers(t *testing.T) {
	js, err := format.CompileJSONSchema(`{"type":"object","properties":{"qty":{"type":"array","items":{"type":"number","minimum":0,"multipleOf":0.5}},"n":{"type":"integer"}}}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	many := func(n string) []byte {
		return []byte(`{"qty":[` + strings.Repeat(n+",", (256<<10)/(len(n)+1)) + `0]}`)
	}
	for _, c := range []struct {
		name    string
		payload []byte
		ok      bool
	}{
		{"30 of 1e999999", []byte(`{"qty":[` + strings.Repeat("1e999999,", 29) + `1e999999]}`), false},
		{"one of 1E-999999", []byte(`{"n":1, "qty":[1E-999999]}`), false},
		{"an integer of 1e999999", []byte(`{"n":1e999999}`), false},
		{"1001 digits", []byte(`{"qty":[1` + strings.Repeat("0", format.MaxJSONNumberDigits) + `]}`), false},
		{"256 KiB of 1e1000", many("1e1000"), true},
		{"256 KiB of 1000 digits", many("1" + strings.Repeat("0", format.MaxJSONNumberDigits-1)), true},
		{"256 KiB of 1000 digits after the point", many("0." + strings.Repeat("0", format.MaxJSONNumberDigits-2) + "5"), false},
		{"real values", []byte(`{"n":-12,"qty":[1.5,2,1e308,4.5e+2,"x1e9999999"]}`), false}, // a string in qty
		{"real values", []byte(`{"n":-12,"qty":[1.5,2,1e308,4.5e+2],"s":"1e9999999 \" 1e9999999"}`), true},
	} {
		start := time.Now()
		_, reason, ok := js.Check(c.payload)
		took := time.Since(start)
		t.Logf("%s (%d bytes): %v %.100s in %v", c.name, len(c.payload), ok, reason, took.Round(time.Millisecond))
		if ok != c.ok {
			t.Errorf("%s: valid %v (%s), want %v", c.name, ok, reason, c.ok)
		}
		if limit := 300 * time.Millisecond; len(c.payload) > 1<<10 && took > 10*limit || len(c.payload) <= 1<<10 && took > limit {
			t.Errorf("%s: validating %d bytes took %v", c.name, len(c.payload), took.Round(time.Millisecond))
		}
	}
}
