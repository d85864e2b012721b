package schemafirst

import (
	"errors"
	"fmt"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/internal/textcut"
)

// A payload that does not fit its schema (ErrMismatch, *MismatchError),
// and the bounds on what a payload costs before it is read by its schema.

// ErrMismatch is a payload that does not fit its schema (a missing
// required field, a field the schema does not have, a value of another
// type): the event goes to the dead-letter topic. Its error is a
// *MismatchError.
var ErrMismatch = errors.New("the payload does not fit its schema")

// MismatchError is a payload that does not fit the schema of its subject:
// Field is where (a JSON pointer, "/order/qty"; "" for the whole payload),
// Reason what.
type MismatchError struct {
	Subject string
	Version int
	Field   string
	Reason  string
}

func (e *MismatchError) Error() string {
	field := e.Field
	if field == "" {
		field = "/"
	}
	return fmt.Sprintf("subject %s version %d: field %s: %s", e.Subject, e.Version, field, e.Reason)
}

// Is makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// MaxPayloadTokens bounds the JSON that a schema-first format converts:
// its objects, arrays, members and array items (its '{', '[', ':' and
// ',' outside strings). Converting costs memory by the value, whatever
// its bytes: some 60 bytes of heap a token for the parsed JSON of
// registered_avro, 100 for registered_jsonschema's validation, 200 for
// registered_protobuf's dynamic messages (2.9 MiB of "{}," in an array,
// within postgres.max_message_bytes: 1,000,000 empty messages, a peak of
// 333 MiB). A payload of more is ErrTooLarge (dead-lettered too_large)
// before it is parsed: at the bound a payload costs a peak of some 8 to
// 25 MiB. Outbox events hold tens to thousands.
const MaxPayloadTokens = 1 << 17

// jsonTokens counts payload's tokens as MaxPayloadTokens does, stopping
// past most: over is whether there are more than most, n the bytes read.
func jsonTokens(payload []byte, most int) (n int, over bool) {
	tokens := 0
	in := false
	for i := 0; i < len(payload); i++ {
		c := payload[i]
		if in {
			switch c {
			case '\\':
				i++
			case '"':
				in = false
			}
			continue
		}
		switch c {
		case '"':
			in = true
		case '{', '[', ':', ',':
			if tokens++; tokens > most {
				return i + 1, true
			}
		}
	}
	return len(payload), false
}

// capped bounds the values of w, a writer whose value is about its
// payload's size (Protobuf's binary encoding of protojson's JSON, JSON
// Schema's JSON as it is): measured once written.
func capped(w func(dst, payload []byte) ([]byte, *MismatchError)) func(dst, payload []byte, maxBytes int) ([]byte, error) {
	if w == nil {
		return nil
	}
	return func(dst, payload []byte, maxBytes int) ([]byte, error) {
		out, merr := w(dst, payload)
		if merr != nil {
			return nil, merr
		}
		if maxBytes > 0 && len(out) > maxBytes {
			return nil, fmt.Errorf("%w: %d bytes, more than the %d of a record to the topic", format.ErrTooLarge, len(out), maxBytes)
		}
		return out, nil
	}
}

// maxReason bounds a mismatch's field and reason: they go into the log and
// the dead letter's error header, and may quote the payload's values.
const maxReason = 300

// clip cuts s to maxReason bytes, on a character boundary.
func clip(s string) string { return textcut.Clip(s, maxReason) }
