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
	"unicode/utf8"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/schemafirst"
	"github.com/walrelay/walrelay/internal/testkit/longtest"
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
	js, err := schemafirst.CompileJSONSchema(`{"type":"object","properties":{"qty":{"type":"array","items":{"type":"number","minimum":0,"multipleOf":0.5}},"n":{"type":"integer"}}}`, nil)
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
		{"1001 digits", []byte(`{"qty":[1` + strings.Repeat("0", schemafirst.MaxJSONNumberDigits) + `]}`), false},
		{"256 KiB of 1e1000", many("1e1000"), true},
		{"256 KiB of 1000 digits", many("1" + strings.Repeat("0", schemafirst.MaxJSONNumberDigits-1)), true},
		{"256 KiB of 1000 digits after the point", many("0." + strings.Repeat("0", schemafirst.MaxJSONNumberDigits-2) + "5"), false},
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
		js, err := schemafirst.CompileJSONSchema(`{"$defs":{"n":{"`+kw+`":[
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
			{nested(40, "1"), false, "could take more than"},
			{nested(40, `"x"`), false, "could take more than"},
			{nested(3000, "1"), false, "could take more than"},
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
		js, err := schemafirst.CompileJSONSchema(schema, nil)
		if err != nil {
			t.Fatal(err)
		}
		tree := strings.Repeat(`{"v":1,"kids":[`, 200) + `{"v":2}` + strings.Repeat(`]}`, 200)
		if _, reason, ok := js.Check([]byte(tree)); !ok {
			t.Errorf("a tree 200 deep: %s", reason)
		}
		bad := strings.Repeat(`{"v":1,"kids":[`, 200) + `{"v":"x"}` + strings.Repeat(`]}`, 200)
		if _, reason, ok := js.Check([]byte(bad)); ok || strings.Contains(reason, "could take more than") {
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
	longtest.Skip(t)
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
		js, err := schemafirst.CompileJSONSchema(chainedRefsSchema(c.hops), nil)
		if err != nil {
			t.Fatal(err)
		}
		payload := []byte(strings.Repeat("[", c.depth) + `"` + strings.Repeat("x", 120<<10) + `"` + strings.Repeat("]", c.depth))
		_, reason, ok := js.Check(payload)
		if ok != c.ok || (!ok && !strings.Contains(reason, "could nest more than 10000")) {
			t.Errorf("%d nested arrays, %d references a level: valid %v (%.100s), want %v", c.depth, c.hops, ok, reason, c.ok)
		}
	}

	// The depth of a kept cost counts where it is read: an object
	// 4,500 deep (9,000 nested applications) costed through one
	// reference, then read through 1,200 more on the same value.
	var b strings.Builder
	b.WriteString(`{"$defs":{"o":{"type":"object","properties":{"x":{"$ref":"#/$defs/o"}}}`)
	for i := 0; i < 1200; i++ {
		fmt.Fprintf(&b, `,"r%d":{"$ref":"#/$defs/r%d"}`, i, i+1)
	}
	b.WriteString(`,"r1200":{"$ref":"#/$defs/o"}},"properties":{"pad":{"type":"string"}},"allOf":[{"$ref":"#/$defs/o"}`)
	near, err := schemafirst.CompileJSONSchema(b.String()+`]}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	far, err := schemafirst.CompileJSONSchema(b.String()+`,{"$ref":"#/$defs/r0"}]}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte(`{"pad":"` + strings.Repeat("x", 300<<10) + `","x":` + strings.Repeat(`{"x":`, 4500) + `{}` + strings.Repeat(`}`, 4501))
	if _, reason, ok := near.Check(payload); !ok {
		t.Errorf("4,500 nested objects through one reference each: %.100s", reason)
	}
	if _, reason, ok := far.Check(payload); ok || !strings.Contains(reason, "could nest more than") {
		t.Errorf("4,500 nested objects, then 1,200 references around them: valid %v (%.100s), want beyond MaxJSONSchemaDepth", ok, reason)
	}
}

// checkWithin is js.Check(payload), failing t if it has not returned
// within d (the goroutine is left to run until the test binary ends): for
// payloads that the old code validated for minutes.
func checkWithin(t *testing.T, js *schemafirst.JSONSchema, payload []byte, d time.Duration) (reason string, ok bool) {
	t.Helper()
	type result struct {
		reason string
		ok     bool
	}
	done := make(chan result, 1)
	go func() {
		_, reason, ok := js.Check(payload)
		done <- result{reason, ok}
	}()
	select {
	case r := <-done:
		return r.reason, r.ok
	case <-time.After(d):
		t.Fatalf("%d bytes: still validating after %v", len(payload), d)
		return "", false
	}
}

// doublingSchema is a small schema (some 60 bytes a level) whose
// subschemas double at each level: a_k = kw [a_(k-1), a_(k-1)].
func doublingSchema(levels int, kw string) string {
	var b strings.Builder
	b.WriteString(`{"$defs":{"a0":{}`)
	for k := 1; k <= levels; k++ {
		fmt.Fprintf(&b, `,"a%d":{"%s":[{"$ref":"#/$defs/a%d"},{"$ref":"#/$defs/a%d"}]}`, k, kw, k-1, k-1)
	}
	fmt.Fprintf(&b, `},"$ref":"#/$defs/a%d"}`, levels)
	return b.String()
}

// eventsSchema is a realistic batch of events: an array of CloudEvents-like
// envelopes, each a oneOf of variants (by "type"), each variant's data
// with nullable fields written the OpenAPI 3.1 way (anyOf [T, null]).
func eventsSchema(variants int) string {
	var defs, refs []string
	for k := 0; k < variants; k++ {
		defs = append(defs, fmt.Sprintf(`"ev%d":{"type":"object","allOf":[{"$ref":"#/$defs/envelope"}],
		  "properties":{"type":{"const":"ev%d"},"data":{"type":"object","additionalProperties":false,
		    "properties":{"orderId":{"type":"string"},
		      "amount":{"anyOf":[{"$ref":"#/$defs/money"},{"type":"null"}]},
		      "qty":{"anyOf":[{"type":"integer","minimum":0},{"type":"null"}]},
		      "note":{"anyOf":[{"type":"string","maxLength":200},{"type":"null"}]}},
		    "required":["orderId"]}},"required":["type","data"]}`, k, k))
		refs = append(refs, fmt.Sprintf(`{"$ref":"#/$defs/ev%d"}`, k))
	}
	return `{"type":"array","items":{"oneOf":[` + strings.Join(refs, ",") + `]},"$defs":{` + strings.Join(defs, ",") + `,
	  "money":{"type":"number","multipleOf":0.01},
	  "envelope":{"type":"object","properties":{"id":{"type":"string"},"source":{"type":"string"},
	    "time":{"type":"string"},"subject":{"anyOf":[{"type":"string"},{"type":"null"}]}},"required":["id","source","time"]}}}`
}

// TestJSONSchemaCheckWorkCounted (review45's probes): validationCost
// counted an application of a subschema as one step, whatever the
// validator did in it, and walked an object's or array's members at each
// application without counting them. Before:
//   - the validator walks all of an object's members at each application:
//     allOf doubling 17 levels against an object of 5,000 members (40 KB):
//     not done in 30 s (12 levels 1.0 s, 15 levels 6.7 s), within the bound;
//   - the estimate itself, anyOf doubling 25 levels (over any bound)
//     against a flat array: 8 KB 10 s, 120 KB not done in 20 s;
//   - uniqueItems hashes each item whole, at each level: nested arrays
//     3,000 deep (159 KB) not done in 30 s (1,000 deep, 53 KB: 3.5 s);
//   - Go's regexp matches in time of the string times the pattern's
//     program: five patterns [ab]{1000}x against 300 KB, 10.5 s (one: 2.1 s),
//     each a step.
//   - the validator copies a string at every application (for
//     contentEncoding, whether the schema has one or not): some 350 µs for
//     1 MiB: allOf doubling 11 levels against a string of 1 MiB, 1.5 s,
//     14 levels some 12 s.
//
// Each is now charged (a member walked, a pattern by its length and
// program, uniqueItems by the size of the items, a string by its length), and refused as a
// mismatch at once; a small one of each is validated as before, and a
// realistic batch of 4,000 events (612 KB, a oneOf of 24 event types) is
// valid.
func TestJSONSchemaCheckWorkCounted(t *testing.T) {
	longtest.Skip(t)
	const beyond = "could take more than"
	flatArray := func(n int) string { return "[" + strings.TrimSuffix(strings.Repeat("0,", n), ",") + "]" }
	flatObject := func(n int) string {
		var b strings.Builder
		b.WriteString(`{"x":{}`)
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, `,"%x":0`, i)
		}
		return b.String() + "}"
	}
	uniqueNested := `{"$defs":{"n":{"type":"array","uniqueItems":true,
	  "items":{"anyOf":[{"$ref":"#/$defs/n"},{"type":"integer"}]}}},"$ref":"#/$defs/n"}`
	level := ",1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]"
	nestedArrays := func(depth int) string { return strings.Repeat("[", depth) + "0" + strings.Repeat(level, depth) }
	pattern := `{"type":"array","items":{"type":"string","pattern":"[ab]{1000}c"}}`
	fivePatterns := `{"type":"array","items":{"allOf":[{"pattern":"[ab]{1000}c"},{"pattern":"[ab]{1000}d"},{"pattern":"[ab]{1000}e"},{"pattern":"[ab]{1000}f"},{"pattern":"[ab]{1000}g"}]}}`
	strings1 := func(n int) string { return `["` + strings.Repeat("a", n) + `"]` }
	for _, c := range []struct {
		name, schema, payload string
		ok                    bool
		reason                string
	}{
		{"allOf 17 levels, 5,000 members", doublingSchema(17, "allOf"), flatObject(5000), false, beyond},
		{"allOf 12 levels, 5,000 members", doublingSchema(12, "allOf"), flatObject(5000), false, beyond},
		{"allOf 4 levels, 5,000 members", doublingSchema(4, "allOf"), flatObject(5000), true, ""},
		{"anyOf 25 levels, 60,000 items", doublingSchema(25, "anyOf"), flatArray(60000), false, beyond},
		{"anyOf 25 levels, 20,000 members", doublingSchema(25, "anyOf"), flatObject(20000), false, beyond},
		{"uniqueItems 3,000 deep", uniqueNested, nestedArrays(3000), false, beyond},
		{"uniqueItems 1,000 deep", uniqueNested, nestedArrays(1000), false, beyond},
		{"uniqueItems 20 deep", uniqueNested, nestedArrays(20), true, ""},
		{"a pattern, 300 KB", pattern, strings1(300 << 10), false, beyond},
		{"five patterns, 300 KB", fivePatterns, strings1(300 << 10), false, beyond},
		{"a pattern, 100 bytes", pattern, strings1(100), false, "does not match pattern"},
		{"allOf 14 levels, a string of 1 MiB", doublingSchema(14, "allOf"), `"` + strings.Repeat("x", 1<<20) + `"`, false, beyond},
		{"allOf 4 levels, a string of 1 MiB", doublingSchema(4, "allOf"), `"` + strings.Repeat("x", 1<<20) + `"`, true, ""},
		{"a pattern, 1 KB that matches", pattern, `["` + strings.Repeat("b", 1000) + `c"]`, true, ""},
	} {
		js, err := schemafirst.CompileJSONSchema(c.schema, nil)
		if err != nil {
			t.Fatal(err)
		}
		reason, ok := checkWithin(t, js, []byte(c.payload), 20*time.Second)
		if ok != c.ok || !strings.Contains(reason, c.reason) {
			t.Errorf("%s (%d bytes): valid %v (%.100s), want %v (%s)", c.name, len(c.payload), ok, reason, c.ok, c.reason)
		}
	}

	event := func(k, i int) string {
		return fmt.Sprintf(`{"type":"ev%d","id":"e%d","source":"/orders","time":"2026-12-06T12:00:00Z","subject":null,"data":{"orderId":"o%d","amount":12.5,"qty":3,"note":null}}`, k, i, i)
	}
	for _, c := range []struct {
		types int
		ok    bool
	}{{8, true}, {24, true}, {64, false}} {
		js, err := schemafirst.CompileJSONSchema(eventsSchema(c.types), nil)
		if err != nil {
			t.Fatal(err)
		}
		items := make([]string, 4000)
		for i := range items {
			items[i] = event(i%c.types, i)
		}
		payload := []byte("[" + strings.Join(items, ",") + "]")
		if _, reason, ok := js.Check(payload); ok != c.ok || (!ok && !strings.Contains(reason, beyond)) {
			t.Errorf("4,000 events (%d bytes) of a oneOf of %d event types: valid %v (%.100s), want %v", len(payload), c.types, ok, reason, c.ok)
		}
	}
}

// TestJSONSchemaCheckReasonClipped (review45's
// TestProbe45CheckReasonUnclipped): Check's reason was the validator's,
// whole, and a format's failure quotes the value: a 350 KiB string that is
// not a date made a reason of 1,075,280 bytes, which the inbox's
// undecodable error carries into its log and its dead letter's header.
// The field and the reason are cut to 1 KB now, an ellipsis at the cut;
// a short reason is whole.
func TestJSONSchemaCheckReasonClipped(t *testing.T) {
	// draft-07 asserts formats (Confluent's default draft for JSON Schema).
	js, err := schemafirst.CompileJSONSchema(`{"$schema":"http://json-schema.org/draft-07/schema#","properties":{"d":{"type":"string","format":"date"}}}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, reason, ok := js.Check([]byte(`{"d":"` + strings.Repeat("é", 175<<10) + `"}`))
	if ok || len(reason) > 1024+len("…") || !strings.HasSuffix(reason, "…") || !utf8.ValidString(reason) {
		t.Errorf("a 350 KiB string that is not a date: valid %v, a reason of %d bytes (%.80s…)", ok, len(reason), reason)
	}
	field, reason, ok := js.Check([]byte(`{"d":"x"}`))
	if ok || field != "/d" || strings.Contains(reason, "…") || !strings.Contains(reason, "'x' is not valid date") {
		t.Errorf(`{"d":"x"}: valid %v, at %q: %s`, ok, field, reason)
	}
}

// TestJSONSchemaCheckSchemaWorkCounted (review46's probes): work of the
// validator that the estimate did not charge, each now charged (or, for
// the schema's numbers, refused at compile):
//   - format "regex" (asserted by default for draft-07 and older): the
//     validator compiled the string as a Go regexp at every application,
//     its program as long as the string times its repetitions; \pL{1000}
//     3,000 times (27 KB) took 0.82 s an application, an allOf of 8 of it
//     4.8 s, an array of 8 such strings (240 KB) 5.0 s. Now the string is
//     only parsed, and charged by its bytes, more with a Unicode class or
//     case folding (regexParseSteps);
//   - required (and dependentRequired) was never charged: 5,000 names
//     against 20,000 empty objects (60 KB) took 4.9 s (18 s on a loaded
//     machine); enum was charged only against an object or an array: an
//     enum of 5,000 strings against 50,000 strings (700 KB) took 1.9 s;
//   - the schema's own numbers: multipleOf 1e-200000 against 50,000
//     numbers (100 KB) took 6.1 s, minimum -1e200000 2.1 s; a schema's
//     number is held to a payload's bounds (MaxJSONNumberDigits,
//     MaxJSONNumberExponent) now, and one beyond them does not compile;
//     within them, a comparison with it is charged by its size
//     (multipleOf 0.333…, 999 digits, against 500,000 numbers, 1 MB, took
//     1.9 s, charged as 16 million steps).
//
// Each such payload is refused at once as a mismatch; a small one of
// each is validated as before.
func TestJSONSchemaCheckSchemaWorkCounted(t *testing.T) {
	longtest.Skip(t)
	const beyond = "could take more than"
	draft7 := `{"$schema":"http://json-schema.org/draft-07/schema#",`
	allOf8 := draft7 + `"allOf":[` + strings.TrimSuffix(strings.Repeat(`{"format":"regex"},`, 8), ",") + `]}`
	regexItems := draft7 + `"type":"array","items":{"type":"string","format":"regex"}}`
	repeats := strings.Repeat(`\\pL{1000}`, 3000)
	names := make([]string, 5000)
	for i := range names {
		names[i] = fmt.Sprintf(`"value-%05d"`, i)
	}
	list := strings.Join(names, ",")
	array := func(item string, n int) string {
		return "[" + strings.TrimSuffix(strings.Repeat(item+",", n), ",") + "]"
	}
	for _, c := range []struct {
		name, schema, payload string
		ok                    bool
		reason                string
	}{
		{"format regex, \\pL{1000} 3,000 times", allOf8[:len(draft7)] + `"format":"regex"}`, `"` + repeats + `"`, false, beyond},
		{"format regex, allOf of 8, \\pL{1000} 3,000 times", allOf8, `"` + repeats + `"`, false, beyond},
		{"format regex, 8 strings of \\pL{1000} 3,000 times", regexItems, array(`"`+repeats+`"`, 8), false, beyond},
		{"format regex, (?i)[\\x{101}-\\x{1E942}] 1,000 times", regexItems, array(`"`+strings.Repeat(`(?i)[\\x{101}-\\x{1E942}]`, 1000)+`"`, 1), false, beyond},
		{"format regex, a short one", allOf8, `"^(?i)[a-z]{1,8}\\pL*$"`, true, ""},
		{"format regex, 1 MB of (a|b)", allOf8[:len(draft7)] + `"allOf":[{"format":"regex"},{"format":"regex"}]}`, `"` + strings.Repeat("(a|b)", 200000) + `"`, true, ""},
		{"format regex, not one", allOf8, `"(a"`, false, "is not valid regex"},
		{"required 5,000 against 20,000 objects", `{"type":"array","items":{"required":[` + list + `]}}`, array("{}", 20000), false, beyond},
		{"required 5,000 against 20 objects", `{"type":"array","items":{"required":[` + list + `]}}`, array("{}", 20), false, "missing properties"},
		{"dependentRequired 5,000 against 20,000 objects", `{"type":"array","items":{"dependentRequired":{"a":[` + list + `]}}}`, array(`{"a":0}`, 20000), false, beyond},
		{"enum of 5,000 against 50,000 strings", `{"type":"array","items":{"enum":[` + list + `]}}`, array(`"value-04999"`, 50000), false, beyond},
		{"enum of 5,000 against 50 strings", `{"type":"array","items":{"enum":[` + list + `]}}`, array(`"value-04999"`, 50), true, ""},
		{"multipleOf 1e-1000 against 50 numbers", `{"type":"array","items":{"multipleOf":1e-1000}}`, array("3", 50), true, ""},
		{"multipleOf of 999 digits against 500,000 numbers", `{"type":"array","items":{"multipleOf":0.` + strings.Repeat("3", 999) + `}}`, array("3", 500000), false, beyond},
		{"multipleOf of 999 digits against 50 numbers", `{"type":"array","items":{"multipleOf":0.` + strings.Repeat("3", 999) + `}}`, array("3", 50), false, "multipleOf"},
	} {
		js, err := schemafirst.CompileJSONSchema(c.schema, nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		reason, ok := checkWithin(t, js, []byte(c.payload), 20*time.Second)
		if ok != c.ok || !strings.Contains(reason, c.reason) {
			t.Errorf("%s (%d bytes): valid %v (%.100s), want %v (%s)", c.name, len(c.payload), ok, reason, c.ok, c.reason)
		}
	}
	for _, schema := range []string{`{"type":"array","items":{"multipleOf":1e-200000}}`, `{"type":"array","items":{"minimum":-1e200000}}`,
		`{"type":"array","items":{"maximum":` + strings.Repeat("9", 1001) + `}}`} {
		if _, err := schemafirst.CompileJSONSchema(schema, nil); err == nil || !strings.Contains(err.Error(), "beyond the bounds") {
			t.Errorf("%.60s: compiled (%v), want refused: a number beyond the bounds", schema, err)
		}
	}
	if _, err := schemafirst.CompileJSONSchema(`{"$ref":"n.json"}`, map[string]string{"n.json": `{"multipleOf":1e-5000}`}); err == nil || !strings.Contains(err.Error(), "beyond the bounds") {
		t.Errorf("a referenced schema's multipleOf 1e-5000: compiled (%v), want refused", err)
	}
}
