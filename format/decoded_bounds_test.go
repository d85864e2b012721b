package format_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
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
		if took := time.Since(start); took > time.Second {
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
// by the linear scan (its reason names the bounds, not the validator's
// keyword); a payload of numbers at the bounds is validated (its time is
// logged: seconds under -race on a loaded machine, so only an unbounded
// cost, minutes, fails it), and real values are valid.
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
		if scanned := strings.Contains(reason, "beyond the bounds"); scanned != (c.name != "real values" && !c.ok && len(c.payload) < 1<<10) {
			t.Errorf("%s: refused by the bounds' scan %v (%.100s)", c.name, scanned, reason)
		}
		if took > time.Minute {
			t.Errorf("%s: validating %d bytes took %v", c.name, len(c.payload), took.Round(time.Millisecond))
		}
	}
}

// TestJSONSchemaCheckNestedOneOfBounded: the validator
// (santhosh-tekuri/jsonschema) applies each subschema of a oneOf (or an
// anyOf) to the value in turn, and again at each level: a oneOf of two
// objects, each holding the oneOf again as a property, cost 2^depth (324
// bytes of 20 levels took 8 s, 40 levels, 644 bytes, hours: a
// registered_jsonschema stream, or an inbox partition with
// ValidateJSON, held). Check bounds the work first: a payload within it
// is validated as before (valid, or the validator's reason), one beyond
// it refused at once, its reason saying so. The bound is checked in a
// goroutine with a generous time (the old code did not return).
func TestJSONSchemaCheckNestedOneOfBounded(t *testing.T) {
	for _, kw := range []string{"oneOf", "anyOf"} {
		js, err := format.CompileJSONSchema(`{"$defs":{"n":{"`+kw+`":[
		  {"type":"object","properties":{"child":{"$ref":"#/$defs/n"},"a":{"type":"integer"}},"required":["a"]},
		  {"type":"object","properties":{"child":{"$ref":"#/$defs/n"},"b":{"type":"integer"}},"required":["b"]},
		  {"type":"null"}]}},"$ref":"#/$defs/n"}`, nil)
		if err != nil {
			t.Fatal(err)
		}
		nested := func(depth int, b string) []byte {
			return []byte(strings.Repeat(`{"child":`, depth) + `null,"b":` + b + `}` + strings.Repeat(`,"b":1}`, depth-1))
		}
		for _, c := range []struct {
			payload []byte
			ok      bool
			reason  string
		}{
			{nested(8, "1"), true, ""},
			{nested(8, `"x"`), false, "missing property"},
			{nested(40, "1"), false, "could apply more than"},
			{nested(40, `"x"`), false, "could apply more than"},
			{nested(3000, "1"), false, "could apply more than"},
		} {
			type result struct {
				reason string
				ok     bool
			}
			done := make(chan result, 1)
			start := time.Now()
			go func() {
				_, reason, ok := js.Check(c.payload)
				done <- result{reason, ok}
			}()
			select {
			case r := <-done:
				t.Logf("%s, %d bytes: %v %.90s in %v", kw, len(c.payload), r.ok, r.reason, time.Since(start).Round(time.Millisecond))
				if r.ok != c.ok || !strings.Contains(r.reason, c.reason) {
					t.Errorf("%s, %d bytes: valid %v (%s), want %v (%s)", kw, len(c.payload), r.ok, r.reason, c.ok, c.reason)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s, %d bytes of nested subschemas: still validating after 10 s", kw, len(c.payload))
			}
		}
	}

	// Dynamic and recursive references are costed by their targets: a
	// tree of 2020-12 ($dynamicRef) and of 2019-09 ($recursiveRef),
	// 200 levels deep, is validated.
	for _, schema := range []string{
		`{"$schema":"https://json-schema.org/draft/2020-12/schema","$dynamicAnchor":"node","type":"object",
		  "properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$dynamicRef":"#node"}}}}`,
		`{"$schema":"https://json-schema.org/draft/2019-09/schema","$recursiveAnchor":true,"type":"object",
		  "properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$recursiveRef":"#"}}}}`,
	} {
		js, err := format.CompileJSONSchema(schema, nil)
		if err != nil {
			t.Fatal(err)
		}
		tree := strings.Repeat(`{"v":1,"kids":[`, 200) + `{"v":2}` + strings.Repeat(`]}`, 200)
		if _, reason, ok := js.Check([]byte(tree)); !ok {
			t.Errorf("a tree 200 deep: %s", reason)
		}
		bad := strings.Repeat(`{"v":1,"kids":[`, 200) + `{"v":"x"}` + strings.Repeat(`]}`, 200)
		if _, reason, ok := js.Check([]byte(bad)); ok || strings.Contains(reason, "could apply more than") {
			t.Errorf("a tree 200 deep, its innermost v a string: valid %v (%s), want the validator's reason", ok, reason)
		}
	}
}

// TestDecodeAvroWalrelaysOwnWithinBudget: what walrelay's avro format
// writes of a JSON payload of 1 MB (the default record cap) decodes
// within MaxDecodedBytes for objects of some 20 bytes of JSON or more,
// and arrays of numbers, strings, nulls or empty arrays; an array of
// 125,000 objects of one field, {"a":1} (hamba/avro builds a map of the
// union's branch and one of the record for each: some 90 MiB), is
// refused by default, and taken within a bound raised to 256 MiB (the
// inbox's RegistryConfig.MaxDecodedBytes).
func TestDecodeAvroWalrelaysOwnWithinBudget(t *testing.T) {
	for _, c := range []struct {
		item string
		ok   bool
	}{
		{`{"id":1,"sku":"a-1","qty":2}`, true},
		{`{"id":12345,"name":"Ada Lovelace","tags":["a","b"],"price":9.5}`, true},
		{`[]`, true},
		{`1`, true},
		{`null`, true},
		{`""`, true},
		{`"abcdefgh"`, true},
		{`{"a":1}`, false},
		{`{}`, false},
	} {
		t.Run(c.item, func(t *testing.T) {
			payload := `{"items":[` + strings.Repeat(c.item+",", 1_000_000/(len(c.item)+1)-2) + c.item + `]}`
			s, n, err := format.ValueSchema(format.Payload{Text: []byte(payload), Column: "payload", Expand: true})
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
			ps, err := format.ParseAvro(as.Text, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = format.CheckAvro(ps, body)
			if c.ok && err != nil {
				t.Errorf("a %d-byte payload of %s, a %d-byte datum: %v", len(payload), c.item, len(body), err)
			}
			if !c.ok && !errors.Is(err, format.ErrAvroLimit) {
				t.Errorf("a %d-byte payload of %s, a %d-byte datum: %v, want ErrAvroLimit", len(payload), c.item, len(body), err)
			}
			if err := format.CheckAvroWithin(ps, body, 256<<20); err != nil {
				t.Errorf("a %d-byte payload of %s within 256 MiB: %v", len(payload), c.item, err)
			}
		})
	}
}

// liveAfter returns how much the live heap grew while decode ran and its
// result was kept (what one record costs a consumer holding its value).
func liveAfter(decode func() (any, error)) (uint64, any, error) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	v, err := decode()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(v)
	if after.HeapAlloc < before.HeapAlloc {
		return 0, v, err
	}
	return after.HeapAlloc - before.HeapAlloc, v, err
}

// TestCheckAvroBoundsDecodedSize (review43a's
// TestProbeCheckAvroDecodedSizeUnbounded): CheckAvro bounded a
// datum's lengths, counts and depth by its bytes, but not what hamba/avro
// builds of it: an item of one byte (a record of one int, an empty map)
// becomes a map[string]any of some 400 bytes, and 1,048,576 empty records
// (MaxAvroEmptyItems then) cost 5 bytes of datum. A single Kafka record within
// the broker's default 1 MiB, in the inbox consumer, holds hundreds of MiB
// (the product's bound is 64 MiB RSS; a container's memory limit kills
// the consumer, again at every restart on the same record: the class
// inboxsafe38 meant to close). It should be ErrAvroLimit (dead-lettered
// undecodable) or decode within a bound.
func TestCheckAvroBoundsDecodedSize(t *testing.T) {
	const budget = 64 << 20 // the whole process's bound; a 5-byte datum gets half
	count := func(n int) []byte { return binary.AppendVarint(nil, int64(n)) }
	items := func(n int, item []byte) []byte {
		b := append(count(n), bytes.Repeat(item, n)...)
		return append(b, 0)
	}
	const n = 1<<20 - 16 // a 1 MiB record
	cases := []struct {
		name, schema string
		body         []byte
	}{
		{"1 MiB: array of records of one int", `{"type":"array","items":{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}}`, items(n, []byte{2})},
		{"1 MiB: array of maps of one entry", `{"type":"array","items":{"type":"map","values":"null"}}`, items(n/3, []byte{2, 0, 0})},
		{"1 MiB: array of unions of a record", `{"type":"array","items":["null",{"type":"record","name":"U","fields":[{"name":"a","type":"boolean"}]}]}`, items(n/2, []byte{2, 1})},
		{"5 bytes: 2^20 empty records", `{"type":"array","items":{"type":"record","name":"E","fields":[]}}`, append(count(1<<20), 0)},
		{"5 bytes: MaxAvroEmptyItems empty records", `{"type":"array","items":{"type":"record","name":"E","fields":[]}}`, append(count(format.MaxAvroEmptyItems), 0)},
		{"1 MiB: array of unions of an empty record", `{"type":"array","items":["null",{"type":"record","name":"U","fields":[]}]}`, items(n, []byte{2})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := format.ParseAvro(c.schema, nil)
			if err != nil {
				t.Fatal(err)
			}
			grew, _, err := liveAfter(func() (any, error) { return format.DecodeAvroWith(format.AvroDecodeConfig(), s, c.body) })
			if errors.Is(err, format.ErrAvroLimit) {
				return // refused: dead-lettered, nothing built
			}
			t.Logf("%d-byte datum: %d MiB live", len(c.body), grew>>20)
			limit := uint64(budget)
			if len(c.body) < 16 {
				limit = budget / 2
			}
			if grew > limit {
				t.Errorf("a %d-byte datum decoded (err %v) into %d MiB of live heap, more than %d MiB: not refused by CheckAvro", len(c.body), err, grew>>20, limit>>20)
			}
		})
	}
}

// TestCheckAvroEmptyNestedRecordsBounded: an array of a record of two
// fields of a record of two fields, and so on 60 deep, all empty (a
// schema of some 3 KB): each item costs 2^60 maps decoded, and is
// refused at once (the estimate neither recomputed by branch nor
// overflowing); so is the record itself, a datum of 0 bytes (the walk,
// by schema, had visited 2^60 records).
func TestCheckAvroEmptyNestedRecordsBounded(t *testing.T) {
	const depth = 60
	schema := `{"type":"record","name":"R0","fields":[]}`
	for i := 1; i <= depth; i++ {
		schema = fmt.Sprintf(`{"type":"record","name":"R%d","fields":[{"name":"a","type":%s},{"name":"b","type":"R%d"}]}`, i, schema, i-1)
	}
	s, err := format.ParseAvro(`{"type":"array","items":`+schema+`}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = format.CheckAvro(s, []byte{2, 0})
	if !errors.Is(err, format.ErrAvroLimit) || time.Since(start) > time.Second {
		t.Errorf("one item of 2^%d empty records: %v in %v, want ErrAvroLimit at once", depth, err, time.Since(start))
	}
	r, err := format.ParseAvro(schema, nil) // the record itself: 0 bytes
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	err = format.CheckAvro(r, nil)
	if !errors.Is(err, format.ErrAvroLimit) || time.Since(start) > time.Second {
		t.Errorf("a record of 2^%d empty records, 0 bytes: %v in %v, want ErrAvroLimit at once", depth, err, time.Since(start))
	}
}

// chainedRefsSchema is an array (or a string) whose items go through a
// chain of hops references back to it: each level of a payload of nested
// arrays is hops+2 nested applications of subschemas (the array's, its
// items', the references').
func chainedRefsSchema(hops int) string {
	var b strings.Builder
	b.WriteString(`{"$defs":{"a":{"type":["array","string"],"items":{"$ref":"#/$defs/c1"}}`)
	for i := 1; i < hops; i++ {
		fmt.Fprintf(&b, `,"c%d":{"$ref":"#/$defs/c%d"}`, i, i+1)
	}
	fmt.Fprintf(&b, `,"c%d":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`, hops)
	return b.String()
}

// TestJSONSchemaCheckDepthBounded (review45's
// TestProbe45ValidatorStackOverflow): nothing bounded how deep the
// validator's recursion or validationCost's nested but the steps: 9,000
// nested arrays (padded with a 120 KB string, for the steps) against 100
// chained references a level (a 5 KB schema) were 900,000 nested calls,
// "fatal error: stack overflow" in validationCost, which kills the
// process (walrelay at the row, at every restart; the inbox's consumer).
// Beyond MaxJSONSchemaDepth nested applications the payload is a
// mismatch, within it it is validated. (On the old code this test does
// not fail: its binary dies.)
func TestJSONSchemaCheckDepthBounded(t *testing.T) {
	for _, c := range []struct {
		hops, depth int
		ok          bool
	}{
		{100, 9000, false},
		{100, 97, true},  // 102 nested applications a level: 9,894, the root and the leaf
		{100, 99, false}, // 10,100
		{1, 3000, true},  // 3 a level: 9,000
		{1, 9000, false},
	} {
		js, err := format.CompileJSONSchema(chainedRefsSchema(c.hops), nil)
		if err != nil {
			t.Fatal(err)
		}
		payload := []byte(strings.Repeat("[", c.depth) + `"` + strings.Repeat("x", 120<<10) + `"` + strings.Repeat("]", c.depth))
		_, reason, ok := js.Check(payload)
		if ok != c.ok || (!ok && !strings.Contains(reason, "could nest more than 10000")) {
			t.Errorf("%d nested arrays, %d references a level: valid %v (%.100s), want %v", c.depth, c.hops, ok, reason, c.ok)
		}
	}

	// The depth of a kept cost counts where it is read: an object read
	// through 100 references, inside one read through 9,000 more.
	var b strings.Builder
	b.WriteString(`{"$defs":{"o":{"type":"object","properties":{"x":{"$ref":"#/$defs/o"}}}`)
	for i := 0; i < 9000; i++ {
		fmt.Fprintf(&b, `,"r%d":{"$ref":"#/$defs/r%d"}`, i, i+1)
	}
	b.WriteString(`,"r9000":{"$ref":"#/$defs/o"}},"type":"object","properties":{"near":{"$ref":"#/$defs/o"},"far":{"$ref":"#/$defs/r0"}}}`)
	js, err := format.CompileJSONSchema(b.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	inner := strings.Repeat(`{"x":`, 1500) + `{}` + strings.Repeat(`}`, 1500)
	if _, reason, ok := js.Check([]byte(`{"near":` + inner + `}`)); !ok {
		t.Errorf("1,500 nested objects through one reference each: %s", reason)
	}
	for _, p := range []string{`{"near":` + inner + `,"far":` + inner + `}`, `{"far":` + inner + `,"near":` + inner + `}`} {
		if _, reason, ok := js.Check([]byte(p)); ok || !strings.Contains(reason, "could nest more than") {
			t.Errorf("1,500 nested objects, then 9,000 references around them: valid %v (%.100s), want beyond MaxJSONSchemaDepth", ok, reason)
		}
	}
}
