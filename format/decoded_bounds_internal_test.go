package format

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestDecimalUnscaledBoundedText: registered_avro reads a payload's
// decimal (a number, or a string of one) with apd and math/big, whose
// cost grows faster than the text: a 1 MiB number of digits took that
// CPU for one field of one row, holding the stream. A text longer than
// any decimal within MaxAvroDecimalPrecision needs is a mismatch at
// once; a schema's precision beyond the bound too.
func TestDecimalUnscaledBoundedText(t *testing.T) {
	for _, c := range []struct {
		name             string
		v                any
		precision, scale int
	}{
		{"1 MiB of digits", json.Number("1" + strings.Repeat("0", 1<<20)), MaxAvroDecimalPrecision, 0},
		{"1 MiB of digits after the point", "0." + strings.Repeat("0", 1<<20) + "1", MaxAvroDecimalPrecision, MaxAvroDecimalPrecision},
		{"scale of 10^7", json.Number("1"), 10_000_000, 10_000_000},
	} {
		start := time.Now()
		n, why := decimalUnscaled(c.v, c.precision, c.scale)
		took := time.Since(start)
		if why == "" || took > time.Second {
			t.Errorf("%s: %v %q in %v, want a reason at once", c.name, n != nil, why, took.Round(time.Millisecond))
		}
	}
	if n, why := decimalUnscaled(json.Number("1."+strings.Repeat("0", 1500)), MaxAvroDecimalPrecision, 2); why != "" || n.Int64() != 100 {
		t.Errorf("1.000… (1500 zeros) at scale 2: %v %q, want 100", n, why)
	}
}
