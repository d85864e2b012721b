package registry

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Confluent's wire format: a record's key or value is the magic byte 0,
// the schema's id (4 bytes, big-endian), then the encoded value.
const magic = 0

// Frame appends body framed in Confluent's wire format with the schema id.
func Frame(dst []byte, id uint32, body []byte) []byte {
	dst = append(dst, magic)
	dst = binary.BigEndian.AppendUint32(dst, id)
	return append(dst, body...)
}

// Unframe splits a value in Confluent's wire format into its schema id and
// its body.
func Unframe(b []byte) (id uint32, body []byte, err error) {
	if len(b) < 5 || b[0] != magic {
		return 0, nil, errors.New("not in Confluent's wire format (magic byte 0 and a 4-byte schema id)")
	}
	return binary.BigEndian.Uint32(b[1:5]), b[5:], nil
}

// Subject is the subject of a topic's keys or values under the topic name
// strategy (Confluent's TopicNameStrategy, Apicurio's TopicIdStrategy):
// <topic>-key, <topic>-value.
func Subject(topic string, key bool) string {
	if key {
		return topic + "-key"
	}
	return topic + "-value"
}

// MaxSubjectBytes bounds a subject that walrelay makes of an event's type
// (the type and topic_type strategies): Apicurio keeps a subject (an
// artifact id) in 512 characters, and a request whose path is kilobytes
// long gets no answer from it at all.
const MaxSubjectBytes = 512

// TypeSubject checks subject, made of the event's type typ (the
// application's data), before any request names it: a subject that no
// registry can have, or that changes the request's path (".", "..", which
// a server normalizes away: "/subjects/../versions/latest" is
// "/versions/latest", a 404 without Confluent's error code, read as a
// wrong URL, which would hold the whole stream for ever on one event), is
// the event's error, wrapping kind (ErrNotRegistered, ErrSchemaUnknown)
// and naming the type.
func TypeSubject(kind error, subject, typ string) error {
	why := ""
	switch {
	case subject == "":
		why = "an empty subject"
	case subject == "." || subject == "..":
		why = "a path segment that the request's URL loses"
	case len(subject) > MaxSubjectBytes:
		why = fmt.Sprintf("a subject of %d bytes, more than the %d a registry keeps", len(subject), MaxSubjectBytes)
	case !utf8.ValidString(subject):
		why = "not UTF-8"
	case strings.IndexFunc(subject, unicode.IsControl) >= 0:
		why = "a control character, which a registry refuses in a subject"
	default:
		return nil
	}
	return fmt.Errorf("%w: the event's type %q (%d bytes) cannot name a subject: %s", kind, clip(typ), len(typ), why)
}

// Subject strategies of the schema-first formats (package
// format/schemafirst) and of the passthrough format (besides its own):
// which subject an event's schema is a version of.
const (
	// StrategyType: the subject is the event's type.
	StrategyType = "type"
	// StrategyTopicType: the subject is <topic>-<type>.
	StrategyTopicType = "topic_type"
	// StrategySubject: one configured subject (and version) for every
	// event.
	StrategySubject = "subject"
)
