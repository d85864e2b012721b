package schemafirst

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/internal/testkit/heappeak"
)

// uncapped makes a registered_avro writer (compileAvro) one without a
// bound whose error is a *MismatchError, as the tests of its conversions
// use it.
func uncapped(w func(dst, payload []byte, maxBytes int) ([]byte, error), err error) (func(dst, payload []byte) ([]byte, *MismatchError), error) {
	if err != nil {
		return nil, err
	}
	return func(dst, payload []byte) ([]byte, *MismatchError) {
		out, err := w(dst, payload, 0)
		var me *MismatchError
		if errors.As(err, &me) {
			return nil, me
		}
		if err != nil {
			return nil, &MismatchError{Reason: err.Error()}
		}
		return out, nil
	}, nil
}

// optionalFields is a record's fields f0… of ["null","long"], default
// null.
func optionalFields(n int) string {
	var fields []string
	for i := range n {
		fields = append(fields, fmt.Sprintf(`{"name":"f%d","type":["null","long"],"default":null}`, i))
	}
	return strings.Join(fields, ",")
}

// TestSchemaFirstAvroValueBoundedAsWritten (from review43a's
// TestProbeSchemaFirstAvroValueUnbounded): registered_avro gave a
// record's missing fields their defaults in a map[string]any each
// before hamba/avro wrote them, some 3 KB of heap for each 3 bytes of a
// payload of empty objects in an array of a record of 50 optional
// fields: a 90 KB payload cost a peak of some 325 MiB (the 1 MiB payload
// the outbox takes, gigabytes: walrelay killed, again on the same row
// after each restart), for a value of 1.5 MB, over the record cap. The
// value is written as it is converted, and refused (ErrTooLarge:
// dead-lettered too_large) once past the cap; without a cap, it costs
// about its own bytes.
func TestSchemaFirstAvroValueBoundedAsWritten(t *testing.T) {
	schema := `{"type":"record","name":"Order","fields":[{"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[` + optionalFields(50) + `]}}}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		if !strings.HasPrefix(r.URL.Path, "/subjects/") {
			http.NotFound(w, r)
			return
		}
		b, _ := json.Marshal(map[string]any{"subject": "orders-value", "version": 1, "id": 1, "schema": schema})
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	enc := schemaFirst(t, srv.URL, Config{Kind: KindAvro})
	const maxBytes = 1000012 // kafka.batch_max_bytes's default
	if _, err := enc.Value(t.Context(), "orders", "Order", []byte(`{"items":[{}]}`), maxBytes); err != nil {
		t.Fatal(err) // the schema fetched and compiled outside the measure
	}
	payload := []byte(`{"items":[` + strings.Repeat("{},", 29999) + `{}]}`)
	for _, c := range []struct {
		name     string
		maxBytes int
		peak     uint64
	}{
		{"capped", maxBytes, 16 << 20},
		{"no cap", 0, 16 << 20},
	} {
		var out []byte
		var err error
		peak := heappeak.Of(func() { out, err = enc.Value(t.Context(), "orders", "Order", payload, c.maxBytes) })
		t.Logf("%s: a %d-byte payload: a %d-byte value, err %v, peak live heap %d KiB", c.name, len(payload), len(out), err, peak>>10)
		if peak > c.peak {
			t.Errorf("%s: a %d-byte payload in registered_avro cost a peak of %d MiB of live heap (its value %d bytes, err %v), more than %d MiB", c.name, len(payload), peak>>20, len(out), err, c.peak>>20)
		}
		switch {
		case c.maxBytes > 0 && !errors.Is(err, format.ErrTooLarge):
			t.Errorf("%s: a value of 30,000 × 50 nulls (1.5 MB) under a cap of %d bytes: %d bytes, err %v; want ErrTooLarge (dead-lettered too_large)", c.name, c.maxBytes, len(out), err)
		case c.maxBytes == 0 && (err != nil || len(out) != 5+300*4+30000*50+1):
			t.Errorf("%s: %d bytes, err %v; want the value, 5+1501201 bytes", c.name, len(out), err)
		}
	}
}

// TestSchemaFirstAvroWritesAsHamba: the writer writes the bytes hamba/avro
// writes of the same value (blocks of 100 items with their sizes, unions'
// indexes, logical types, defaults), so what was written before it is
// what is written now.
func TestSchemaFirstAvroWritesAsHamba(t *testing.T) {
	schema := `{"type":"record","name":"R","namespace":"n","fields":[
	 {"name":"id","type":"long"},{"name":"i","type":"int"},{"name":"ok","type":"boolean"},
	 {"name":"f","type":"float"},{"name":"d","type":"double"},{"name":"s","type":"string"},
	 {"name":"b","type":"bytes"},{"name":"x","type":{"type":"fixed","name":"X","size":2}},
	 {"name":"e","type":{"type":"enum","name":"E","symbols":["A","B"]}},
	 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
	 {"name":"at","type":["null",{"type":"long","logicalType":"timestamp-micros"}],"default":null},
	 {"name":"day","type":{"type":"int","logicalType":"date"},"default":3},
	 {"name":"u","type":["null","string","n.X"]},
	 {"name":"m","type":{"type":"map","values":"long"},"default":{"k":7}},
	 {"name":"items","type":{"type":"array","items":{"type":"record","name":"I","fields":[` + optionalFields(3) + `,
	   {"name":"tags","type":{"type":"array","items":"string"},"default":["a","b"]}]}}},
	 {"name":"empty","type":{"type":"array","items":"null"}}]}`
	w, err := uncapped(compileAvro(schema, nil, func(field, reason string) *MismatchError { return &MismatchError{Field: field, Reason: reason} }))
	if err != nil {
		t.Fatal(err)
	}
	items := `{"f1": 5}` + strings.Repeat(`, {}, {"f0": -1, "tags": ["x"]}`, 150)
	payload := `{"id": -4294967296, "i": 7, "ok": true, "f": 1.5, "d": -2.25, "s": "é", "b": "\u00ff\u0000", "x": "ab", "e": "B",
	 "amount": "12.34", "at": "2024-02-29T12:00:00.000001Z", "u": {"n.X": "zz"}, "items": [` + items + `], "empty": [null, null]}`
	out, me := w(nil, []byte(payload))
	if me != nil {
		t.Fatal(me)
	}
	ls, err := format.ParseAvro(schema, nil)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := avro.Unmarshal(ls, out, &v); err != nil {
		t.Fatalf("hamba/avro cannot read what was written: %v", err)
	}
	again, err := avro.Marshal(ls, v)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, again) {
		t.Errorf("written:\n%x\nhamba/avro writes the value it reads of it:\n%x", out, again)
	}
	r := v.(map[string]any)
	if len(r["items"].([]any)) != 301 || r["m"].(map[string]any)["k"] != int64(7) {
		t.Errorf("read back: %d items, map %v", len(r["items"].([]any)), r["m"])
	}
}

// TestSchemaFirstAvroDefaultsBounded: a schema whose defaults nest
// records of many fields of {} has defaults whose encoding grows with the
// power of its depth (20 fields 4 deep: 160,000 records of 20 longs for
// a payload of {}); one whose default is of its own record again has
// none (converting it recursed until the stack overflowed). Compiling
// keeps a bounded encoding of the defaults; writing is bounded by the
// cap; a default of its own record is a mismatch.
func TestSchemaFirstAvroDefaultsBounded(t *testing.T) {
	level := fmt.Sprintf(`{"type":"record","name":"L0","fields":[%s]}`, strings.ReplaceAll(optionalFields(20), `["null","long"],"default":null`, `"long","default":1`))
	for i := 1; i <= 4; i++ {
		var fields []string
		for j := range 20 {
			typ := level
			if j > 0 {
				typ = fmt.Sprintf(`"L%d"`, i-1)
			}
			fields = append(fields, fmt.Sprintf(`{"name":"g%d","type":%s,"default":{}}`, j, typ))
		}
		level = fmt.Sprintf(`{"type":"record","name":"L%d","fields":[%s]}`, i, strings.Join(fields, ","))
	}
	mismatch := func(field, reason string) *MismatchError { return &MismatchError{Field: field, Reason: reason} }
	var out []byte
	var werr error
	peak := heappeak.Of(func() {
		w, err := compileAvro(level, nil, mismatch)
		if err != nil {
			t.Fatal(err)
		}
		out, werr = w(nil, []byte(`{}`), 1000012)
	})
	t.Logf("defaults 4 deep: %d bytes, err %v, peak live heap %d KiB", len(out), werr, peak>>10)
	if !errors.Is(werr, format.ErrTooLarge) {
		t.Errorf("a payload {} of defaults 20⁴ records of 20 longs (3.2 MB): %d bytes, err %v; want ErrTooLarge", len(out), werr)
	}
	if peak > 16<<20 {
		t.Errorf("compiling and writing defaults 4 deep cost a peak of %d MiB of live heap", peak>>20)
	}

	self := `{"type":"record","name":"R","fields":[{"name":"a","type":"long","default":1},{"name":"next","type":["R","null"],"default":{}}]}`
	w, err := compileAvro(self, nil, mismatch)
	if err != nil {
		t.Logf("a default of its own record refused when parsed: %v", err)
		return
	}
	if _, err := w(nil, []byte(`{}`), 0); !errors.Is(err, ErrMismatch) {
		t.Errorf("a default of its own record again: %v; want a mismatch", err)
	}
}

// TestSchemaFirstPayloadTokensBounded: a schema-first format converts
// the payload's JSON into values that cost memory by the value, whatever
// their bytes: 2.9 MB of empty objects (within postgres.max_message_bytes)
// in an array of an empty message cost a peak of 333 MiB in
// registered_protobuf (dynamic messages), 134 MiB in
// registered_jsonschema (its validation), 166 MiB in registered_avro (the
// parsed JSON and the value built), though each value is under the record
// cap. A payload of
// more than MaxPayloadTokens is ErrTooLarge (dead-lettered too_large)
// before it is parsed; one within it is written, at a bounded peak.
func TestSchemaFirstPayloadTokensBounded(t *testing.T) {
	schemas := map[string]string{
		KindAvro:       `{"type":"record","name":"M","fields":[{"name":"items","type":{"type":"array","items":{"type":"record","name":"E","fields":[]}}}]}`,
		KindProtobuf:   `syntax = "proto3"; package p; message M { repeated E items = 1; } message E {}`,
		KindJSONSchema: `{"type":"object","properties":{"items":{"type":"array","items":{"type":"object"}}}}`,
	}
	for _, kind := range []string{KindAvro, KindProtobuf, KindJSONSchema} {
		t.Run(kind, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
				if !strings.HasPrefix(r.URL.Path, "/subjects/") {
					http.NotFound(w, r)
					return
				}
				b, _ := json.Marshal(map[string]any{"subject": "M", "version": 1, "id": 1, "schema": schemas[kind], "schemaType": kind})
				_, _ = w.Write(b)
			}))
			defer srv.Close()
			enc := schemaFirst(t, srv.URL, Config{Kind: kind})
			if _, err := enc.Value(t.Context(), "t", "M", []byte(`{"items":[{}]}`), 1000012); err != nil {
				t.Fatal(err) // the schema fetched and compiled outside the measure
			}
			items := func(n int) []byte { return []byte(`{"items":[` + strings.Repeat("{},", n-1) + `{}]}`) }
			for _, c := range []struct {
				n    int
				over bool
				peak uint64
			}{
				{1000000, true, 8 << 20},
				{MaxPayloadTokens/2 - 10, false, 40 << 20},
			} {
				payload := items(c.n)
				var out []byte
				var err error
				peak := heappeak.Of(func() { out, err = enc.Value(t.Context(), "t", "M", payload, 8<<20) })
				t.Logf("%d empty objects (%d bytes): %d bytes, err %v, peak %d KiB", c.n, len(payload), len(out), err, peak>>10)
				if c.over != errors.Is(err, format.ErrTooLarge) || !c.over && err != nil {
					t.Errorf("%d empty objects: %v; want ErrTooLarge %v", c.n, err, c.over)
				}
				if peak > c.peak {
					t.Errorf("%d empty objects (%d bytes) cost a peak of %d MiB, more than %d MiB", c.n, len(payload), peak>>20, c.peak>>20)
				}
			}
		})
	}
}

// TestAvroUnionBranchesBounded: a union of two records, each holding the
// union again, whose first record branch fails late (after writing the
// nested union: R1 lacks the field b, and its required a is missing) was
// tried branch after branch at every level: 2^depth writes of the nested
// value; 40 levels, a payload of 660 bytes, did not finish in 5 s on the
// old code (an outbox row that held the relay). Each union now resolves
// each object once: the steps (values written) grow with the payload,
// and the value is written as before (each level R2, branch 2), or a
// mismatch at the outer union's field when the innermost value fits
// neither. Steps are counted, not timed: 40 levels cost some 1,000.
func TestAvroUnionBranchesBounded(t *testing.T) {
	t.Parallel()
	schemaText := `{"type":"record","name":"R1","fields":[
	 {"name":"child","type":["null","R1",{"type":"record","name":"R2","fields":[
	   {"name":"child","type":["null","R1","R2"]},{"name":"b","type":"long"}]}]},
	 {"name":"a","type":"long"}]}`
	schema, err := format.ParseAvroWrite(schemaText, nil)
	if err != nil {
		t.Fatal(err)
	}
	payload := func(depth int, innermost string) string {
		return `{"child":` + strings.Repeat(`{"child":`, depth) + `null,"b":` + innermost + `}` + strings.Repeat(`,"b":1}`, depth-1) + `,"a":1}`
	}
	// R1 {child: R2 {child: … R2 {child: null, b: 1} …, b: 1}, a: 1}:
	// depth times branch 2 (zigzag 4), null (branch 0), depth times b
	// 1 (zigzag 2), a 1.
	want := func(depth int) []byte {
		return slices.Concat(bytes.Repeat([]byte{4}, depth), []byte{0}, bytes.Repeat([]byte{2}, depth), []byte{2})
	}
	for _, depth := range []int{1, 10, 20, 40, 1000, 5000} {
		for _, fits := range []bool{true, false} {
			innermost := "1"
			if !fits {
				innermost = `"x"`
			}
			p := payload(depth, innermost)
			v, err := decodeJSON([]byte(p))
			if err != nil {
				t.Fatal(err)
			}
			w := jsonAvroWriter{}
			field, reason := w.value(schema, v)
			if w.steps > 4*len(p) {
				t.Fatalf("%d levels of a union of two records (fits %v): %d values written for a payload of %d bytes, want at most 4 a byte", depth, fits, w.steps, len(p))
			}
			switch {
			case fits && (reason != "" || !bytes.Equal(w.buf, want(depth))):
				t.Errorf("%d levels: %x, mismatch %q %q; want %x", depth, w.buf, field, reason, want(depth))
			case !fits && (field != "/child" || !strings.HasPrefix(reason, "fits none of the union's types (null | R1 | R2)")):
				t.Errorf("%d levels, innermost b a string: mismatch %q %q; want at /child, fits none of the union's types", depth, field, reason)
			}
			if depth == 40 {
				t.Logf("%d levels, %d bytes (fits %v): %d steps", depth, len(p), fits, w.steps)
			}
		}
	}

	// As registered_avro writes it (the reviewer's payload: 40 levels).
	wr, err := compileAvro(schemaText, nil, func(field, reason string) *MismatchError { return &MismatchError{Field: field, Reason: reason} })
	if err != nil {
		t.Fatal(err)
	}
	if out, err := wr(nil, []byte(payload(40, "1")), 1<<20); err != nil || !bytes.Equal(out, want(40)) {
		t.Errorf("40 levels: %x, %v; want %x", out, err, want(40))
	}
	var raw map[string]any
	if err := avro.Unmarshal(schema, want(40), &raw); err != nil {
		t.Errorf("the bytes expected do not decode: %v", err)
	}
	_, err = wr(nil, []byte(payload(40, `"x"`)), 1<<20)
	wantMismatch(t, "40 levels, innermost b a string", err, "/child")
}

// TestAvroUnionStepsBounded: what the unions' kept branches leave
// quadratic (a union of records whose second branch walks a map of
// records to the bottom of the value at each level: no union there to
// keep a choice, d²/2 values written) stops at the bound of steps
// (avroSteps) with a mismatch that says so (dead-lettered), rather than
// hold the relay; 100 levels are written, or a mismatch of the union.
func TestAvroUnionStepsBounded(t *testing.T) {
	t.Parallel()
	schema := `{"type":"record","name":"R","fields":[{"name":"c","type":["null",
	  {"type":"record","name":"R2","fields":[{"name":"c","type":{"type":"map","values":{"type":"record","name":"S","fields":[
	    {"name":"c","type":{"type":"map","values":"S"},"default":{}}]}}},{"name":"b","type":"long"}]},
	  {"type":"record","name":"R1","fields":[{"name":"c","type":["null","R1","R2"]},{"name":"a","type":"long"}]}]}]}`
	w, err := compileAvro(schema, nil, func(field, reason string) *MismatchError { return &MismatchError{Field: field, Reason: reason} })
	if err != nil {
		t.Fatal(err)
	}
	nested := func(depth int, end string) []byte {
		return []byte(`{"c":` + strings.Repeat(`{"c":`, depth) + end + strings.Repeat(`}`, depth) + `}`)
	}
	// 100 levels of R1: written.
	fits := `{"c":` + strings.Repeat(`{"c":`, 100) + `null` + strings.Repeat(`,"a":1}`, 100) + `}`
	if _, err := w(nil, []byte(fits), 1<<20); err != nil {
		t.Errorf("100 levels that fit: %v", err)
	}
	// 100 levels that fit no branch (no a, no b): the union's mismatch.
	_, err = w(nil, nested(100, `{}`), 1<<20)
	var me *MismatchError
	if !errors.As(err, &me) || me.Field != "/c" || !strings.HasPrefix(me.Reason, "fits none of the union's types") {
		t.Errorf("100 levels that fit no branch: %v; want a mismatch at /c, fits none", err)
	}
	// 3,000 levels (18 KB): some 4.5 million steps, beyond the bound.
	p := nested(3000, `{}`)
	_, err = w(nil, p, 1<<20)
	if !errors.As(err, &me) || !strings.Contains(me.Reason, fmt.Sprintf("could not be resolved within %d values written", avroSteps(len(p), 1<<20))) {
		t.Errorf("3,000 levels: %v; want a mismatch: not resolved within the bound of steps", err)
	}
}
