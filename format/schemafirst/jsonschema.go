package schemafirst

import (
	"bytes"
	"fmt"
	"regexp"
	"regexp/syntax"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/internal/textcut"
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

// JSONSchema is a compiled JSON Schema of the registry, with the
// subschemas its dynamic and recursive references may resolve to
// (validationCost).
type JSONSchema struct {
	s       *jsonschema.Schema
	targets refTargets
}

// CompileJSONSchema compiles a JSON Schema of the registry (refs: the
// schemas it references, by the name it references them with, as
// Registry.References gives them). The schema's draft is its $schema
// (default 2020-12); nothing is fetched from elsewhere.
func CompileJSONSchema(text string, refs map[string]string) (*JSONSchema, error) {
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	// Once the schema is compiled, the validator calls its regexp engine
	// only to check format "regex" (asserted by default for draft-07 and
	// older), a string of the payload at every application, which only
	// has to parse: Go's regexp.Compile also builds its program, as long
	// as the string times its repetitions (\pL{1000} 3,000 times, 27 KB,
	// took 0.82 s an application, 26 ms to parse).
	var compiled atomic.Bool
	c.UseRegexpEngine(func(re string) (jsonschema.Regexp, error) {
		if !compiled.Load() {
			return regexp.Compile(re)
		}
		if _, err := syntax.Parse(re, syntax.Perl); err != nil {
			return nil, err
		}
		return &parsedRegexp{s: re}, nil
	})
	// The schema's numbers are held to a payload's bounds: the validator
	// compares a value with them (minimum, maximum, multipleOf, const,
	// enum) in math/big at every application, and validationCost charges
	// the payload's number, not the schema's (multipleOf 1e-200000 against
	// 50,000 numbers, 100 KB, took 6.1 s).
	if reason := jsonNumbersWithin([]byte(text)); reason != "" {
		return nil, fmt.Errorf("the JSON Schema: %s", reason)
	}
	for name, t := range refs {
		if reason := jsonNumbersWithin([]byte(t)); reason != "" {
			return nil, fmt.Errorf("the referenced JSON Schema %s: %s", name, reason)
		}
	}
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
	compiled.Store(true)
	js := &JSONSchema{s: sch}
	js.targets.collect(sch, map[*jsonschema.Schema]bool{})
	return js, nil
}

// parsedRegexp is a regular expression that parsed, compiled only if
// matched (format "regex" only checks that it parses).
type parsedRegexp struct {
	s    string
	once sync.Once
	re   *regexp.Regexp
}

func (r *parsedRegexp) String() string { return r.s }

// MatchString compiles the expression, once, and matches s (never, if
// it does not compile: the validator does not match a format's regex).
func (r *parsedRegexp) MatchString(s string) bool {
	r.once.Do(func() { r.re, _ = regexp.Compile(r.s) })
	return r.re != nil && r.re.MatchString(s)
}

// Check validates payload, a JSON document: ok, or where it fails (a JSON
// pointer, "" for the whole document) and why, each at most 1 KB
// (maxCheckReason, cut with an ellipsis).
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
		return "", clipCheckReason(fmt.Sprintf("not JSON: %v", err)), false
	}
	limit := jsonSchemaSteps(len(payload))
	n, deep := validationCost(s.s, &s.targets, v, limit)
	if deep {
		return "", fmt.Sprintf("validating it could nest more than %d applications of subschemas (MaxJSONSchemaDepth): its values or the references between its subschemas nested too deep", MaxJSONSchemaDepth), false
	}
	if n > limit {
		return "", fmt.Sprintf("validating it could take more than %d steps (%d, and %d a byte of the payload): subschemas applied to its values (anyOf, oneOf or allOf nested too deep), members walked, patterns matched or items compared", limit, jsonSchemaStepsBase, jsonSchemaStepsPerByte), false
	}
	if err := s.s.Validate(v); err != nil {
		ve, isVE := err.(*jsonschema.ValidationError)
		if !isVE {
			return "", clipCheckReason(err.Error()), false
		}
		field, reason = firstCause(ve)
		return clipCheckReason(field), clipCheckReason(reason), false
	}
	return "", "", true
}

// maxCheckReason bounds JSONSchema.Check's field and reason: the
// validator's reason quotes the value (a format's failure three times: a
// 358 KB string that is not a date made a reason of 1,075,280 bytes),
// and the inbox's undecodable error carries it into its log and its dead
// letter's header.
const maxCheckReason = 1024

// clipCheckReason cuts s to maxCheckReason bytes, on a character
// boundary, and marks the cut with an ellipsis.
func clipCheckReason(s string) string { return textcut.Clip(s, maxCheckReason) }

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
	MaxJSONNumberDigits = format.MaxNumberLength
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
