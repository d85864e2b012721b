package format

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// jsonSchemaURL is the URL the subject's schema is compiled under.
const jsonSchemaURL = "walrelay:///subject.json"

// compileJSONSchema compiles a JSON Schema of the registry (refs: the
// schemas it references, by the name it references them with) and
// returns the writer of JSON payloads valid in it: the JSON as it is,
// after Confluent's framing. The schema's draft is its $schema (default
// 2020-12); nothing is fetched from elsewhere.
func compileJSONSchema(text string, refs map[string]string, mismatch func(field, reason string) *MismatchError) (func(dst, payload []byte) ([]byte, *MismatchError), error) {
	sch, err := CompileJSONSchema(text, refs)
	if err != nil {
		return nil, err
	}
	return func(dst, payload []byte) ([]byte, *MismatchError) {
		if field, reason, ok := sch.Check(payload); !ok {
			return nil, mismatch(field, reason)
		}
		return append(dst, payload...), nil
	}, nil
}

// JSONSchema is a compiled JSON Schema of the registry.
type JSONSchema struct{ s *jsonschema.Schema }

// CompileJSONSchema compiles a JSON Schema of the registry (refs: the
// schemas it references, by the name it references them with, as
// Registry.References gives them). The schema's draft is its $schema
// (default 2020-12); nothing is fetched from elsewhere.
func CompileJSONSchema(text string, refs map[string]string) (*JSONSchema, error) {
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("parse the JSON Schema: %w", err)
	}
	if err := c.AddResource(jsonSchemaURL, doc); err != nil {
		return nil, fmt.Errorf("the JSON Schema: %w", err)
	}
	for name, t := range refs {
		d, err := jsonschema.UnmarshalJSON(strings.NewReader(t))
		if err != nil {
			return nil, fmt.Errorf("parse the referenced JSON Schema %s: %w", name, err)
		}
		if err := c.AddResource("walrelay:///"+strings.TrimPrefix(name, "/"), d); err != nil {
			return nil, fmt.Errorf("the referenced JSON Schema %s: %w", name, err)
		}
	}
	sch, err := c.Compile(jsonSchemaURL)
	if err != nil {
		return nil, fmt.Errorf("compile the JSON Schema: %w", err)
	}
	return &JSONSchema{sch}, nil
}

// Check validates payload, a JSON document: ok, or where it fails (a JSON
// pointer, "" for the whole document) and why.
func (s *JSONSchema) Check(payload []byte) (field, reason string, ok bool) {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return "", fmt.Sprintf("not JSON: %v", err), false
	}
	if err := s.s.Validate(v); err != nil {
		ve, isVE := err.(*jsonschema.ValidationError)
		if !isVE {
			return "", err.Error(), false
		}
		field, reason = firstCause(ve)
		return field, reason, false
	}
	return "", "", true
}

var english = message.NewPrinter(language.English)

// firstCause is the first innermost error of a validation: where (a JSON
// pointer) and what.
func firstCause(ve *jsonschema.ValidationError) (field, reason string) {
	for len(ve.Causes) > 0 {
		ve = ve.Causes[0]
	}
	var sb strings.Builder
	for _, t := range ve.InstanceLocation {
		sb.WriteString("/" + pointerToken(t))
	}
	return sb.String(), ve.ErrorKind.LocalizedString(english)
}

// noLoader refuses every URL the schema does not hold: walrelay fetches
// no schema from the network or the disk.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s: not in the registry's schema or its references (walrelay loads nothing else)", url)
}
