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
//
// A number with more than MaxJSONNumberDigits digits or an exponent
// beyond ±MaxJSONNumberExponent is refused before the validation, which
// reads numbers with math/big (1e999999 took some 20 ms each).
func (s *JSONSchema) Check(payload []byte) (field, reason string, ok bool) {
	if reason := jsonNumbersWithin(payload); reason != "" {
		return "", reason, false
	}
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

// Bounds of a number in a JSON document that a JSON Schema validates
// (JSONSchema.Check: registered_jsonschema's payloads, the inbox's
// ValidateJSON): the validator reads numbers with math/big's Rat, whose
// cost grows with the digits and with 10^exponent (1e999999, 8 bytes,
// costs some 20 ms; a payload of them hours), so a number beyond them is
// refused (a schema mismatch, the inbox's undecodable) by a linear scan
// before it. No real value comes near: a double's exponent is within
// ±324, PostgreSQL's numeric writes no exponent, and Jackson (a Java
// consumer's JSON reader) refuses a number of more than 1000 characters
// by default (StreamReadConstraints).
const (
	// MaxJSONNumberDigits is how many digits (before and after the
	// point) one number may have: Jackson's MaxNumberLength.
	MaxJSONNumberDigits = MaxNumberLength
	// MaxJSONNumberExponent is how large an exponent (after e or E, either
	// sign) one number may have.
	MaxJSONNumberExponent = 1000
)

// jsonNumbersWithin scans b, a JSON document, for a number beyond
// MaxJSONNumberDigits or MaxJSONNumberExponent, in one pass without
// allocating: "" if none, or why not. What is not JSON is left to the
// parser after it.
func jsonNumbersWithin(b []byte) string {
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c == '"' {
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			continue
		}
		if c != '-' && (c < '0' || c > '9') {
			continue
		}
		start, digits, exp, inExp := i, 0, 0, false
	number:
		for ; i < len(b); i++ {
			c := b[i]
			switch {
			case c >= '0' && c <= '9':
				if !inExp {
					digits++
				} else if exp <= MaxJSONNumberExponent {
					exp = exp*10 + int(c-'0')
				}
			case c == 'e' || c == 'E':
				inExp = true
			case c == '.' || c == '-' || c == '+':
			default:
				break number
			}
		}
		end := i
		i-- // the byte after the number is looked at again
		if digits > MaxJSONNumberDigits || exp > MaxJSONNumberExponent {
			return fmt.Sprintf("a number at byte %d (%s) beyond the bounds of %d digits and an exponent of ±%d", start, clipValue(string(b[start:end])), MaxJSONNumberDigits, MaxJSONNumberExponent)
		}
	}
	return ""
}
