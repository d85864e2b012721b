package schemafirst

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/walrelay/walrelay/format"
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
		{"1 MiB of digits", json.Number("1" + strings.Repeat("0", 1<<20)), format.MaxAvroDecimalPrecision, 0},
		{"1 MiB of digits after the point", "0." + strings.Repeat("0", 1<<20) + "1", format.MaxAvroDecimalPrecision, format.MaxAvroDecimalPrecision},
		{"scale of 10^7", json.Number("1"), 10_000_000, 10_000_000},
	} {
		start := time.Now()
		n, why := decimalUnscaled(c.v, c.precision, c.scale)
		took := time.Since(start)
		if why == "" || took > time.Second {
			t.Errorf("%s: %v %q in %v, want a reason at once", c.name, n != nil, why, took.Round(time.Millisecond))
		}
	}
	if n, why := decimalUnscaled(json.Number("1."+strings.Repeat("0", 1500)), format.MaxAvroDecimalPrecision, 2); why != "" || n.Int64() != 100 {
		t.Errorf("1.000… (1500 zeros) at scale 2: %v %q, want 100", n, why)
	}
}

// TestValidationCostStopsAtItsBound (review45's
// TestProbe45ValidationCostWideLeaf): the estimate walked a flat array's
// or object's members at every application to it (its cost not kept)
// without counting them: anyOf doubling 25 levels against a flat array of
// 4,000 items (8 KB) took 10 s before it refused, 60,000 (120 KB) did not
// finish in 20 s. Its own work is counted in its steps now, members and
// all, and it stops beyond its bound: at most the bound and one
// application's work.
func TestValidationCostStopsAtItsBound(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"$defs":{"a0":{}`)
	for k := 1; k <= 25; k++ {
		fmt.Fprintf(&b, `,"a%d":{"anyOf":[{"$ref":"#/$defs/a%d"},{"$ref":"#/$defs/a%d"}]}`, k, k-1, k-1)
	}
	b.WriteString(`},"$ref":"#/$defs/a25"}`)
	js, err := CompileJSONSchema(b.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{100, 4000, 60000} {
		payload := "[" + strings.TrimSuffix(strings.Repeat("0,", n), ",") + "]"
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(payload))
		if err != nil {
			t.Fatal(err)
		}
		limit := jsonSchemaSteps(len(payload))
		c := costing{refTargets: &js.targets, limit: limit, memo: map[costKey]known{}}
		cost, _ := c.cost(js.s, v)
		if cost <= limit {
			t.Errorf("%d items: cost %d, within %d", n, cost, limit)
		}
		if most := limit + applicationSteps + n; c.steps > most {
			t.Errorf("%d items: the estimate took %d steps, beyond %d", n, c.steps, most)
		}
	}
}
