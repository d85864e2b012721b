package format_test

import (
	"errors"
	"fmt"
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
