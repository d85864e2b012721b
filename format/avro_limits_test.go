package format

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walrelay/walrelay/format/registry"
)

// wideObject is a JSON object of n keys k0…, each of value 1.
func wideObject(n int) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"k%d":1`, i)
	}
	b.WriteString("}")
	return b.String()
}

// TestAvroWidePayloadLinear: a payload object of 40 000 keys (a map by id)
// is parsed, translated and written in Avro in well under a second: the
// time is linear in the keys (it was quadratic: 63 s), so the stream is
// not held on it.
func TestAvroWidePayloadLinear(t *testing.T) {
	const keys = 40000
	payload := wideObject(keys)
	start := time.Now()
	s, n := valueSchema(Payload{Text: []byte(payload), Column: "payload", Expand: true})
	if s.Type != "struct" || len(s.Fields) != keys {
		t.Fatalf("not expanded: %s with %d fields", s.Type, len(s.Fields))
	}
	as, err := Avro(s)
	if err != nil {
		t.Fatal(err)
	}
	b, err := as.EncodeAvro(s, n)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("%d keys (%d KB): %v, schema %d KB, value %d bytes", keys, len(payload)>>10, took, len(as.Text)>>10, len(b))
	// A hang check (the quadratic path took 112 s; the linear one 0.1 s,
	// 3.6 s under the race detector on a loaded machine): the speed itself
	// is BenchmarkAvroEncoderValue's.
	if took > 30*time.Second {
		t.Errorf("%d keys took %v to parse, translate and encode", keys, took)
	}
	if len(b) != 2*keys { // each field: union branch 1, int 1
		t.Errorf("%d bytes, want %d", len(b), 2*keys)
	}
}

// TestAvroDeepNesting: Jackson's limits decide as Debezium's chain does. A
// payload nested deeper than Jackson reads (1000) is left a
// io.debezium.data.Json string; one whose Avro schema nests deeper than
// Jackson writes (1000: some 250 nested objects, 498 nested arrays) fails
// Debezium's converter, an error here (the event dead-lettered as
// `format`); below, it is written. Each quickly (nesting 200 took 10 s,
// 1100 more than 10 minutes).
func TestAvroDeepNesting(t *testing.T) {
	objects := func(d int) string { return strings.Repeat(`{"d":`, d) + "1" + strings.Repeat("}", d) }
	arrays := func(d int) string { return `{"a":` + strings.Repeat("[", d) + "1" + strings.Repeat("]", d) + "}" }
	for _, c := range []struct {
		name    string
		payload string
		want    string // "ok", "string" (left a string), "fails" (converter)
	}{
		{"objects 200", objects(200), "ok"},
		{"objects 250", objects(250), "ok"},
		{"objects 251", objects(251), "fails"},
		{"objects 1000", objects(1000), "fails"},
		{"objects 1001", objects(1001), "string"},
		{"objects 5000", objects(5000), "string"},
		{"arrays 498", arrays(498), "ok"},
		{"arrays 499", arrays(499), "fails"},
		{"arrays 999", arrays(999), "fails"},
		{"arrays 1000", arrays(1000), "string"},
	} {
		start := time.Now()
		s, n := valueSchema(Payload{Text: []byte(c.payload), Column: "payload", Expand: true})
		as, err := Avro(s)
		if err == nil {
			_, err = as.EncodeAvro(s, n)
		}
		took := time.Since(start)
		got := "ok"
		switch {
		case s == JSONTextSchema:
			got = "string"
		case err != nil:
			got = "fails"
		}
		if got != c.want {
			t.Errorf("%s: %s (%v), want %s", c.name, got, err, c.want)
		}
		if took > 20*time.Second { // a hang check: nesting 200 took 10 s, 1100 more than 10 minutes
			t.Errorf("%s: %v to encode (the stream is held meanwhile)", c.name, took)
		}
	}
}

// TestParseJSONLimits: Jackson's read limits (StreamReadConstraints, as
// Debezium 3.6.1 reads a payload; measured with its jars): nesting 1000,
// a number's digits 1000 (integer, fraction and exponent digits), a key
// 50 000 characters, a string 20 000 000. Beyond, the payload is not
// expanded.
func TestParseJSONLimits(t *testing.T) {
	digits := func(n int) string { return strings.Repeat("1", n) }
	for _, c := range []struct {
		name, in string
		ok       bool
	}{
		{"nesting 1000", strings.Repeat("[", 1000) + strings.Repeat("]", 1000), true},
		{"nesting 1001", strings.Repeat("[", 1001) + strings.Repeat("]", 1001), false},
		{"integer 1000 digits", `{"x":-` + digits(1000) + `}`, true},
		{"integer 1001 digits", `{"x":` + digits(1001) + `}`, false},
		{"fraction 1000 digits", `{"x":-1.` + digits(999) + `}`, true},
		{"fraction 1001 digits", `{"x":1.` + digits(1000) + `}`, false},
		{"exponent 1000 digits", `{"x":1.` + digits(499) + `e-` + strings.Repeat("0", 499) + `1}`, true},
		{"exponent 1001 digits", `{"x":1.` + digits(500) + `e` + strings.Repeat("0", 499) + `1}`, false},
		{"key 50000", `{"` + strings.Repeat("a", 50000) + `":1}`, true},
		{"key 50001", `{"` + strings.Repeat("a", 50001) + `":1}`, false},
		{"key 25000 surrogate pairs", `{"` + strings.Repeat("😀", 25000) + `":1}`, true},
		{"key 25001 surrogate pairs", `{"` + strings.Repeat("😀", 25001) + `":1}`, false},
	} {
		_, err := ParseJSON([]byte(c.in))
		if c.ok && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if !c.ok && !errors.Is(err, ErrJSONLimit) {
			t.Errorf("%s: %v, want ErrJSONLimit", c.name, err)
		}
		s, _ := valueSchema(Payload{Text: []byte(c.in), Column: "payload", Expand: true})
		if !c.ok && s != JSONTextSchema {
			t.Errorf("%s: expanded (%s), want it left a string", c.name, s.Type)
		}
	}
	// A string's length (parsing 20 MB twice would slow the suite).
	for n, ok := range map[int]bool{20_000_000: true, 20_000_001: false} {
		if err := checkLength(strings.Repeat("a", n), MaxStringLength, "string"); (err == nil) != ok {
			t.Errorf("a string of %d: %v", n, err)
		}
	}
	if err := checkLength(strings.Repeat("é", 20_000_000), MaxStringLength, "string"); err != nil {
		t.Errorf("20 000 000 two-byte characters: %v", err)
	}
}

// TestAvroShapesKeepNoMemory: payloads of 10 000 distinct shapes (a key
// per customer) are written without the heap growing with the shapes
// seen: nothing is kept per shape on the way (hamba/avro's frozen config
// kept an encoder per schema for ever: +30 MB for 8 000 shapes).
func TestAvroShapesKeepNoMemory(t *testing.T) {
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	encode := func(from, to int) {
		for i := from; i < to; i++ {
			payload := fmt.Sprintf(`{"customer_%d": {"sku_%d": 1, "qty": 2, "note": "x"}}`, i, i)
			s, n := valueSchema(Payload{Text: []byte(payload), Column: "payload", Expand: true})
			as, err := Avro(s)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := as.EncodeAvro(s, n); err != nil {
				t.Fatal(err)
			}
		}
	}
	encode(0, 200) // warm up
	base := heap()
	encode(200, 10200)
	after := heap()
	t.Logf("heap: %d KiB before 10000 shapes, %d KiB after", base>>10, after>>10)
	if after > base+2<<20 {
		t.Errorf("the heap grew by %d KiB over 10000 payload shapes", (after-base)>>10)
	}
}

// TestRegistryIDCacheKeepsNoSchemaText: the cache of ids keeps a hash of
// each schema, not its text: 2 000 schemas of 20 KB (payloads of wide,
// changing shapes) learnt leave the heap about as it was (keyed by the
// text, the cache held 40 MB), and each is still asked for once.
func TestRegistryIDCacheKeepsNoSchemaText(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		fmt.Fprintf(w, `{"id":%d}`, n)
	}))
	defer srv.Close()
	reg := mustRegistry(t, registry.Config{URL: srv.URL, AutoRegister: true})
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	const schemas = 2000
	pad := strings.Repeat("x", 20<<10)
	schema := func(i int) string { return fmt.Sprintf(`{"type":"string","connect.name":"s%d%s"}`, i, pad) }
	base := heap()
	for range 2 {
		for i := range schemas {
			if _, err := reg.ID(t.Context(), "t-value", schema(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	grown := int64(heap()) - int64(base)
	runtime.KeepAlive(reg) // its cache measured
	t.Logf("heap grew %d KiB for %d schemas of %d KB", grown>>10, schemas, len(pad)>>10)
	if grown > 8<<20 {
		t.Errorf("the heap grew by %d KiB for %d ids cached", grown>>10, schemas)
	}
	if calls.Load() != schemas {
		t.Errorf("%d requests for %d schemas, each twice: want one each", calls.Load(), schemas)
	}
}

// valueSchema is ValueSchema for these tests (nil where the payload is
// refused before its schema: the one place to change if ValueSchema's
// results do).
func valueSchema(p Payload) (*ConnectSchema, *Node) {
	s, n, _ := ValueSchema(p)
	return s, n
}
