package format

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hamba/avro/v2"

	"github.com/walrelay/walrelay/format/registry"
)

// ParseAvro parses an Avro schema of the registry with the schemas it
// references (as References gives them, each after those it references
// itself): their named types are parsed first, into the cache the schema
// is parsed with. It is for reading: names are not checked as Java's
// Avro checks them (hamba/avro's own check is off for the whole process),
// so a record that a non-Java producer wrote in a schema with a field
// "first-name" decodes; a schema walrelay writes with is parsed with
// ParseAvroWrite.
//
// hamba/avro panics on some schemas (a record field whose default is of
// its own record, validated: a nil pointer); a registry's answer must not
// stop walrelay or the inbox, so that is an error too.
func ParseAvro(text string, refs []registry.Reference) (s avro.Schema, err error) {
	defer func() {
		if p := recover(); p != nil {
			s, err = nil, fmt.Errorf("parse the Avro schema: hamba/avro fails on it: %v", p)
		}
	}()
	cache := &avro.SchemaCache{}
	for _, r := range refs {
		if _, err := avro.ParseBytesWithCache([]byte(r.Text), "", cache); err != nil {
			return nil, fmt.Errorf("parse the Avro schema's reference %s: %w", r.Name, err)
		}
	}
	schema, err := avro.ParseBytesWithCache([]byte(text), "", cache)
	if err != nil {
		return nil, fmt.Errorf("parse the Avro schema: %w", err)
	}
	if err := avroDecimals(schema, map[avro.Schema]bool{}); err != nil {
		return nil, fmt.Errorf("parse the Avro schema: %w", err)
	}
	return schema, nil
}

// ParseAvroWrite parses an Avro schema that walrelay writes values with
// (a schema-first format's, from the registry or a schema file), as
// ParseAvro does, and refuses (ErrAvroName) the names that Java's Avro
// refuses: Debezium's consumers, and Java's, must read what walrelay
// writes.
func ParseAvroWrite(text string, refs []registry.Reference) (avro.Schema, error) {
	schema, err := ParseAvro(text, refs)
	if err != nil {
		return nil, err
	}
	if err := avroNames(schema, map[avro.Schema]bool{}); err != nil {
		return nil, fmt.Errorf("parse the Avro schema: %w", err)
	}
	return schema, nil
}

// MaxAvroDecimalPrecision bounds a decimal's precision (and so its scale,
// at most its precision) in an Avro schema that ParseAvro takes (a
// schema file, a registry's schema, the inbox's): hamba/avro computes
// 10^scale for every value it decodes or writes (a 2-byte datum of scale
// 10^7 takes seconds), and registered_avro multiplies a payload's
// number by 10^scale. PostgreSQL's numeric takes a precision of at most
// 1000 (its typmod's bound): a schema of a decimal beyond it is refused
// (ErrAvroDecimal), as no column of walrelay's fills it.
const MaxAvroDecimalPrecision = 1000

// ErrAvroDecimal is an Avro schema of a decimal whose precision is beyond
// MaxAvroDecimalPrecision.
var ErrAvroDecimal = errors.New("a decimal's precision beyond the bound")

// avroDecimals checks every decimal logical type in s against
// MaxAvroDecimalPrecision (its scale is at most its precision, or
// hamba/avro drops the logical type).
func avroDecimals(s avro.Schema, seen map[avro.Schema]bool) error {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	if seen[s] {
		return nil
	}
	seen[s] = true
	if l, ok := s.(avro.LogicalTypeSchema); ok {
		if d, ok := l.Logical().(*avro.DecimalLogicalSchema); ok && (d.Precision() > MaxAvroDecimalPrecision || d.Scale() > MaxAvroDecimalPrecision) {
			return fmt.Errorf("a %s decimal of precision %d and scale %d, beyond %d: %w", s.Type(), d.Precision(), d.Scale(), MaxAvroDecimalPrecision, ErrAvroDecimal)
		}
	}
	switch x := s.(type) {
	case *avro.RecordSchema:
		for _, f := range x.Fields() {
			if err := avroDecimals(f.Type(), seen); err != nil {
				return fmt.Errorf("field %q of %q: %w", f.Name(), x.FullName(), err)
			}
		}
	case *avro.ArraySchema:
		return avroDecimals(x.Items(), seen)
	case *avro.MapSchema:
		return avroDecimals(x.Values(), seen)
	case *avro.UnionSchema:
		for _, t := range x.Types() {
			if err := avroDecimals(t, seen); err != nil {
				return err
			}
		}
	}
	return nil
}

// avroNames checks the names in s (its named types' names and namespaces,
// its fields' names, its enums' symbols) as Java's Avro does (avroName):
// hamba/avro's own check is off for the whole process
// (avro.SkipNameValidation), so a schema file or a registry's schema with
// a field "first-name" would otherwise parse, and be written with, though
// no Java consumer reads it (ParseAvroWrite; not what walrelay only
// reads, ParseAvro). The error is ErrAvroName.
func avroNames(s avro.Schema, seen map[avro.Schema]bool) error {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	if seen[s] {
		return nil
	}
	seen[s] = true
	if n, ok := s.(avro.NamedSchema); ok {
		if !avroName(n.Name()) {
			return fmt.Errorf("%s %q: %w", s.Type(), n.Name(), ErrAvroName)
		}
		if ns := n.Namespace(); ns != "" {
			for part := range strings.SplitSeq(ns, ".") {
				if !avroName(part) {
					return fmt.Errorf("%s %q: namespace %q: %w", s.Type(), n.Name(), ns, ErrAvroName)
				}
			}
		}
	}
	switch x := s.(type) {
	case *avro.RecordSchema:
		for _, f := range x.Fields() {
			if !avroName(f.Name()) {
				return fmt.Errorf("field %q of %q: %w", f.Name(), x.FullName(), ErrAvroName)
			}
			if err := avroNames(f.Type(), seen); err != nil {
				return err
			}
		}
	case *avro.EnumSchema:
		for _, sym := range x.Symbols() {
			if !avroName(sym) {
				return fmt.Errorf("symbol %q of enum %q: %w", sym, x.FullName(), ErrAvroName)
			}
		}
	case *avro.ArraySchema:
		return avroNames(x.Items(), seen)
	case *avro.MapSchema:
		return avroNames(x.Values(), seen)
	case *avro.UnionSchema:
		for _, t := range x.Types() {
			if err := avroNames(t, seen); err != nil {
				return err
			}
		}
	}
	return nil
}
