package record

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/format"
)

// Format is how a record's key or value carries the outbox's text, as Kafka
// Connect's converters write the records of Debezium's outbox EventRouter.
type Format string

const (
	// FormatRaw is the text as stored, as the StringConverter writes it.
	// The default.
	FormatRaw Format = "raw"
	// FormatJSON is a JSON string holding the text, as the JsonConverter
	// writes a string with schemas.enable=false (escaped as Jackson
	// escapes).
	FormatJSON Format = "json"
	// FormatJSONSchema is the JsonConverter's envelope of schema and
	// payload (schemas.enable=true) around that string.
	FormatJSONSchema Format = "json_schema"
	// FormatAvro is Avro in Confluent's wire format, its schema in a schema
	// registry, as Apicurio's AvroConverter writes it (as-confluent=true,
	// use-id=contentId, headers.enabled=false): package format.
	FormatAvro Format = "avro"
)

// ParseFormat checks a format's name.
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case "", FormatRaw:
		return FormatRaw, nil
	case FormatJSON, FormatJSONSchema, FormatAvro, FormatRegistryPassthrough, FormatRegisteredAvro, FormatRegisteredProtobuf, FormatRegisteredJSONSchema:
		return f, nil
	}
	return "", fmt.Errorf("format %q: want raw, json, json_schema, avro, registry_passthrough, registered_avro, registered_protobuf or registered_jsonschema", s)
}

// encode returns text in format f; schema is the JsonConverter's schema of
// the field, for FormatJSONSchema. A nil text (a NULL payload) stays nil
// (a tombstone) in FormatRaw, and is JSON's null in the others, as the
// JsonConverter writes it.
func (f Format) encode(text []byte, schema string) []byte {
	return f.envelope(text, schema, jacksonQuote)
}

// encodeBytes returns a bytea payload in format f as the JsonConverter
// writes Connect's bytes: a base64 string (standard alphabet, padded), in a
// schema of type bytes for FormatJSONSchema; NULL as for encode.
func (f Format) encodeBytes(b []byte, schema string) []byte {
	return f.envelope(b, schema, base64Quote)
}

// envelope writes v in format f: quote appends it as a JSON string, in the
// schema-and-payload envelope for FormatJSONSchema.
func (f Format) envelope(v []byte, schema string, quote func(dst, v []byte) []byte) []byte {
	if f == FormatRaw {
		return v
	}
	if v == nil {
		// The JsonConverter writes a null as JSON: no tombstone.
		if f == FormatJSON {
			return []byte("null")
		}
		return append(append([]byte(`{"schema":`), schema...), `,"payload":null}`...)
	}
	out := make([]byte, 0, base64.StdEncoding.EncodedLen(len(v))+len(schema)+32)
	if f == FormatJSONSchema {
		out = append(out, `{"schema":`...)
		out = append(out, schema...)
		out = append(out, `,"payload":`...)
	}
	out = quote(out, v)
	if f == FormatJSONSchema {
		out = append(out, '}')
	}
	return out
}

// base64Quote appends v as a JSON string of its base64 (Jackson's binary
// node).
func base64Quote(dst, v []byte) []byte {
	dst = append(dst, '"')
	dst = base64.StdEncoding.AppendEncode(dst, v)
	return append(dst, '"')
}

// jacksonQuote appends s as a JSON string the way Jackson writes one:
// quote and backslash escaped, control characters as \b \t \n \f \r or
// \u00XX, a character outside the BMP as its escaped surrogate pair, a
// lone surrogate (its WTF-8 bytes, as format.ParseJSON keeps it) as its
// escape \uD800, everything else (slash, non-ASCII, U+2028) as it is.
func jacksonQuote(dst, s []byte) []byte {
	const hex = "0123456789ABCDEF"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			if c < utf8.RuneSelf {
				dst = append(dst, c)
				i++
				continue
			}
			r, n := utf8.DecodeRune(s[i:])
			switch {
			case c == 0xed && i+2 < len(s) && s[i+1] >= 0xa0 && s[i+1] <= 0xbf && s[i+2] >= 0x80 && s[i+2] <= 0xbf:
				// A lone surrogate, as format.ParseJSON keeps it (WTF-8):
				// Jackson writes it escaped.
				u := 0xd000 | rune(s[i+1]&0x3f)<<6 | rune(s[i+2]&0x3f)
				dst = append(dst, '\\', 'u', hex[u>>12&0xf], hex[u>>8&0xf], hex[u>>4&0xf], hex[u&0xf])
				n = 3
			case r == utf8.RuneError && n == 1:
				dst = append(dst, "\uFFFD"...)
			case r > 0xFFFF:
				// Jackson writes a character outside the BMP as its
				// UTF-16 surrogate pair, escaped.
				hi, lo := utf16.EncodeRune(r)
				for _, u := range []rune{hi, lo} {
					dst = append(dst, '\\', 'u', hex[u>>12&0xf], hex[u>>8&0xf], hex[u>>4&0xf], hex[u&0xf])
				}
			default:
				dst = append(dst, s[i:i+n]...)
			}
			i += n
			continue
		}
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\r':
			dst = append(dst, '\\', 'r')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
	}
	return append(dst, '"')
}

// The JsonConverter's schemas of Debezium's outbox records: the key (the
// aggregate id, a required string) and the value by the payload column's
// type (json or jsonb: a string named io.debezium.data.Json; text: a
// string; bytea: bytes), optional unless the column is NOT NULL.
const (
	keySchema = `{"type":"string","optional":false}`

	jsonSchema          = `{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}`
	requiredJSONSchema  = `{"type":"string","optional":false,"name":"io.debezium.data.Json","version":1}`
	textSchema          = `{"type":"string","optional":true}`
	requiredTextSchema  = `{"type":"string","optional":false}`
	bytesSchema         = `{"type":"bytes","optional":true}`
	requiredBytesSchema = `{"type":"bytes","optional":false}`
)

// valueSchema is the JsonConverter's schema of e's value.
func valueSchema(e *event.Event) string {
	switch {
	case e.PayloadBytes && e.PayloadRequired:
		return requiredBytesSchema
	case e.PayloadBytes:
		return bytesSchema
	case e.PayloadText && e.PayloadRequired:
		return requiredTextSchema
	case e.PayloadText:
		return textSchema
	case e.PayloadRequired:
		return requiredJSONSchema
	}
	return jsonSchema
}

// Blank reports whether a payload is NULL or, as Java's String.trim sees
// it, empty: only characters up to U+0020.
func Blank(p []byte) bool {
	for _, c := range p {
		if c > ' ' {
			return false
		}
	}
	return true
}

// jsonKeySchemas is the JsonConverter's schema of a key by its Connect
// schema (format.KeySchemaOf), written once.
var jsonKeySchemas = func() map[*format.ConnectSchema]string {
	m := map[*format.ConnectSchema]string{}
	for _, oid := range []uint32{format.OIDText, format.OIDUUID, format.OIDInt2, format.OIDInt4, format.OIDInt8} {
		for _, nullable := range []bool{false, true} {
			s, _ := format.KeySchemaOf(format.KeyColumn{Type: oid, Nullable: nullable})
			b := `{"type":"` + s.Type + `","optional":` + strconv.FormatBool(!s.Required)
			if s.Name != "" {
				b += `,"name":"` + s.Name + `"`
			}
			if s.Version != 0 {
				b += `,"version":` + strconv.Itoa(s.Version)
			}
			m[s] = b + "}"
		}
	}
	return m
}()

// encodeKey returns the aggregate id key, of column c, in format f (json
// or json_schema) as the JsonConverter writes it in the column's own
// Connect schema, as Debezium's EventRouter gives it: an integer column's
// key a JSON number, a uuid one's schema io.debezium.data.Uuid, a nullable
// column's optional. A column of a type without a known schema keeps a
// required string, as before.
func (f Format) encodeKey(key []byte, c format.KeyColumn) []byte {
	s, err := format.KeySchemaOf(c)
	schema, ok := jsonKeySchemas[s]
	if err != nil || !ok {
		return f.encode(key, keySchema)
	}
	if key == nil || s.Type == "string" {
		return f.encode(key, schema)
	}
	if _, err := strconv.ParseInt(string(key), 10, 64); err != nil {
		return f.encode(key, keySchema) // not from an integer column
	}
	return f.envelope(key, schema, func(dst, v []byte) []byte { return append(dst, v...) })
}
