package inbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/format/schemafirst"
	"github.com/walrelay/walrelay/internal/testkit/heappeak"
)

// TestRegistryProtobufDecodedSizeBounded (review43a's
// TestProbeRegistryProtobufDecodedSizeUnbounded): a Protobuf value was not
// bounded before it was decoded: a 1 MiB Kafka record of a repeated
// empty message (two bytes an element) made dynamicpb, protojson and
// encoding/json build 524,288 messages, a peak of some 184 MiB for one
// record (the product's bound is 64 MiB), again at every restart. It is
// ErrUndecodable (schemafirst.ErrProtobufLimit) before it is built, into any
// target (*any, a proto.Message's Decoded); a message of a few thousand
// elements decodes.
func TestRegistryProtobufDecodedSizeBounded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		b, _ := json.Marshal(map[string]any{"schemaType": "PROTOBUF", "schema": `syntax = "proto3"; package p; message M { repeated E e = 1; repeated int32 n = 2; repeated string s = 3; } message E {}`})
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	reg, err := NewRegistry(RegistryConfig{URL: srv.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := reg.Decode(t.Context(), registry.Frame(nil, 1, []byte{0}), &v); err != nil {
		t.Fatal(err) // the schema fetched and compiled outside the measure
	}
	packed := func(n int) []byte {
		return append(append([]byte{0x12}, protowireVarint(n)...), bytes.Repeat([]byte{1}, n)...)
	}
	for _, c := range []struct {
		name string
		body []byte
		ok   bool
	}{
		{"1 MiB of empty messages", bytes.Repeat([]byte{0x0a, 0x00}, 1<<19), false},
		{"1 MiB of packed int32", packed(1 << 20), false},
		{"1 MiB of empty strings", bytes.Repeat([]byte{0x1a, 0x00}, 1<<19), false},
		{"5,000 empty messages", bytes.Repeat([]byte{0x0a, 0x00}, 5000), true},
		{"20,000 packed int32", packed(20000), true},
		{"a string of 2 MiB", append(append([]byte{0x1a}, protowireVarint(2<<20)...), strings.Repeat("a", 2<<20)...), true},
	} {
		framed := registry.Frame(nil, 1, append([]byte{0}, c.body...)) // indexes [0], then M
		var derr error
		peak := heappeak.Of(func() {
			var v any
			derr = reg.Decode(t.Context(), framed, &v)
		})
		t.Logf("%s: a %d-byte record: err %v, peak live heap %d MiB", c.name, len(framed), derr, peak>>20)
		if c.ok && derr != nil {
			t.Errorf("%s: %v", c.name, derr)
		}
		if !c.ok && (!errors.Is(derr, ErrUndecodable) || !errors.Is(derr, schemafirst.ErrProtobufLimit)) {
			t.Errorf("%s: a %d-byte Protobuf record decoded into *any at a peak of %d MiB of live heap (err %v): want ErrUndecodable before it is built", c.name, len(framed), peak>>20, derr)
		}
		if _, err := reg.Decoded(t.Context(), framed); c.ok != (err == nil) {
			t.Errorf("%s: Decoded: %v", c.name, err)
		}
	}
}

// protowireVarint is n as a Protobuf varint.
func protowireVarint(n int) []byte {
	var b []byte
	for ; n >= 0x80; n >>= 7 {
		b = append(b, byte(n)|0x80)
	}
	return append(b, byte(n))
}

// TestRegistryValidateJSONHugeNumbersUndecodable (review43a's
// TestProbeJSONSchemaHugeExponentCPU, in the inbox): with ValidateJSON, a
// 279-byte record of 30 numbers 1e999999 held the partition for the
// validator's math/big (some 20 ms a number, hours for 1 MiB of them);
// it is undecodable at once (schemafirst.MaxJSONNumberExponent).
func TestRegistryValidateJSONHugeNumbersUndecodable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		b, _ := json.Marshal(map[string]any{"schemaType": "JSON", "schema": `{"type":"object","properties":{"qty":{"type":"array","items":{"type":"integer","minimum":0}}}}`})
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	reg, err := NewRegistry(RegistryConfig{URL: srv.URL, Timeout: 5 * time.Second, ValidateJSON: true})
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := reg.Decode(t.Context(), registry.Frame(nil, 1, []byte(`{"qty":[1]}`)), &v); err != nil {
		t.Fatal(err) // the schema fetched and compiled outside the measure
	}
	framed := registry.Frame(nil, 1, []byte(`{"qty":[`+strings.Repeat("1e999999,", 29)+`1e999999]}`))
	start := time.Now()
	err = reg.Decode(t.Context(), framed, &v)
	if took := time.Since(start); !errors.Is(err, ErrUndecodable) || !strings.Contains(err.Error(), "beyond the bounds") {
		t.Errorf("a %d-byte record of 30 numbers 1e999999: %v in %v, want ErrUndecodable at once", len(framed), err, took.Round(time.Millisecond))
	}
}
