package format

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/hamba/avro/v2"

	"github.com/walrelay/walrelay/format/registry"
)

// benchPayloads are outbox payloads of usual shapes, and a wide one.
var benchPayloads = []struct {
	name string
	p    Payload
}{
	{"order", Payload{Column: "payload", Expand: true, Text: []byte(`{"order":{"id":7,"customer":{"id":"c-1","name":"Ann","email":"ann@example.com"},"lines":[{"sku":"a-1","qty":2,"price":9.5},{"sku":"b-2","qty":1,"price":19.99,"gift":true}],"total":38.99,"paid":true,"note":null},"placed_at":"2026-12-06T08:00:00Z","tags":["new","web"]}`)}},
	{"flat", Payload{Column: "payload", Expand: true, Text: []byte(`{"id":123,"name":"widget","price":1.5,"active":true,"stock":4294967296}`)}},
	{"string", Payload{Column: "payload", Text: []byte(`{"id":123,"name":"widget","price":1.5,"active":true}`)}},
	{"wide1000", Payload{Column: "payload", Expand: true, Text: []byte(wideObject(1000))}},
}

// BenchmarkAvroEncoderValue: AvroEncoder.Value, the avro format's whole
// path for one event (parse, infer, translate, encode, the id from the
// cache, frame), against a registry that answers every registration (the
// id is asked once, then cached).
//
//	go test -run '^$' -bench BenchmarkAvroEncoderValue -benchmem -count 5 ./format/
func BenchmarkAvroEncoderValue(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		fmt.Fprint(w, `{"id":1}`)
	}))
	defer srv.Close()
	reg, err := registry.New(registry.Config{URL: srv.URL, AutoRegister: true})
	if err != nil {
		b.Fatal(err)
	}
	e := NewAvroEncoder(reg)
	for _, c := range benchPayloads {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.p.Text)))
			for b.Loop() {
				if _, err := e.Value(b.Context(), "t", c.p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAvroEncode: writing a parsed payload of its schema, EncodeAvro
// (direct) against the encoder it replaced (legacy: hamba/avro's generic
// encoding, the parsed schema cached by text), in one run.
//
//	go test -run '^$' -bench BenchmarkAvroEncode$ -benchmem -count 5 ./format/
func BenchmarkAvroEncode(b *testing.B) {
	for _, c := range benchPayloads {
		s, n := valueSchema(c.p)
		b.Run(c.name+"/legacy", func(b *testing.B) {
			l := &legacyEncoder{schemas: map[string]avro.Schema{}}
			for b.Loop() {
				if _, _, err := l.encode(s, n); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/direct", func(b *testing.B) {
			for b.Loop() {
				as, err := Avro(s)
				if err == nil {
					_, err = as.EncodeAvro(s, n)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
