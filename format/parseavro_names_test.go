package format_test

import (
	"errors"
	"testing"

	"github.com/walrelay/walrelay/format"
)

// TestParseAvroRefusesNamesJavaRefuses: ParseAvroWrite (the schemas
// walrelay writes with: schema-first's schema files and registry schemas)
// refuses, with ErrAvroName, the names that Java's Avro refuses
// (hamba/avro's own check is off for the whole process, for Java's
// Unicode names), and takes those it takes; ParseAvro (what walrelay
// only reads: the inbox's registry schemas) takes them all.
func TestParseAvroRefusesNamesJavaRefuses(t *testing.T) {
	cases := []struct {
		name, text string
		ok         bool
	}{
		{"field first-name", `{"type":"record","name":"R","fields":[{"name":"first-name","type":"string"}]}`, false},
		{"record 1R", `{"type":"record","name":"1R","fields":[{"name":"a","type":"string"}]}`, false},
		{"field with space", `{"type":"record","name":"R","fields":[{"name":"a b","type":"string"}]}`, false},
		{"enum symbol a-b", `{"type":"record","name":"R","fields":[{"name":"e","type":{"type":"enum","name":"E","symbols":["a-b"]}}]}`, false},
		{"namespace a-b.c", `{"type":"record","name":"R","namespace":"a-b.c","fields":[{"name":"a","type":"string"}]}`, false},
		{"nested fixed F-1", `{"type":"record","name":"R","fields":[{"name":"a","type":{"type":"array","items":["null",{"type":"fixed","name":"F-1","size":2}]}}]}`, false},
		{"unicode names", `{"type":"record","name":"Rü","namespace":"ns.ä","fields":[{"name":"ünï","type":{"type":"enum","name":"E","symbols":["é_1"]}}]}`, true},
		{"recursive", `{"type":"record","name":"L","fields":[{"name":"next","type":["null","L"]}]}`, true},
	}
	for _, c := range cases {
		_, err := format.ParseAvroWrite(c.text, nil)
		if c.ok && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if !c.ok && !errors.Is(err, format.ErrAvroName) {
			t.Errorf("%s: ParseAvroWrite: %v, want ErrAvroName (Java's Avro refuses it)", c.name, err)
		}
		if _, err := format.ParseAvro(c.text, nil); err != nil {
			t.Errorf("%s: ParseAvro (to read): %v", c.name, err)
		}
	}
}
