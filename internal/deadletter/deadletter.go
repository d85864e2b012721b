// Package deadletter makes a dead letter fit the dead-letter topic's cap,
// the one way for both writers of dead letters: the relay's sink (package
// sink, whose poll source shares it) and the inbox consumer (package
// inbox). A dead letter the producer refuses as too large has no further
// place to go: the relay would restart on its event for ever, and the
// consumer would hold its partition for ever. So the text walrelay adds to
// one (an error, a topic) is clipped, and what it copies from the event or
// record (key, headers, and at last the id) is left out, with the bytes
// left out said in a header.
package deadletter

import (
	"slices"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/textcut"
)

// Headers that say what a dead letter left out.
const (
	// HeaderKeyHeadersOmitted is the bytes of the key and of the headers
	// (names and values) left out of a dead letter.
	HeaderKeyHeadersOmitted = "walrelay.key_headers_omitted_bytes"
	// HeaderIDOmitted is the bytes cut from the end of the id of a dead
	// letter whose id alone was over the cap: its id header holds a
	// prefix of the event's id.
	HeaderIDOmitted = "walrelay.id_omitted_bytes"
)

// MaxText is the most bytes of a text walrelay adds to a dead letter (the
// error, the topic meant): an error may quote a value of the event (a
// topic built from a 64 KB aggregate type, a validator's reason quoting the
// value), and a dead letter carrying it whole could be refused.
const MaxText = 1024

// note is the room a header saying what was left out takes: its name, up
// to 20 digits and its framing.
const note = 64

// Clip returns s whole if it has at most max bytes, else its first whole
// runes ending in "…" and its full length, max bytes in all:
// "outbox.event.wwww… (65549 bytes)".
func Clip(s string, max int) []byte {
	if len(s) <= max {
		return []byte(s)
	}
	tail := "… (" + strconv.Itoa(len(s)) + " bytes)"
	return append([]byte(prefix(s, max-len(tail))), tail...)
}

// prefix returns s's first n bytes at most, ending at a rune's boundary.
func prefix(s string, n int) string { return textcut.Prefix(s, n) }

// Size is the bytes r takes against a producer's batch cap, as the sink
// estimates them: its key, value, headers' names and values, 10 bytes of
// framing per header, its topic and 256 bytes for the batch's own fields.
func Size(r *kgo.Record) int {
	n := 256 + len(r.Topic) + len(r.Key) + len(r.Value) + 10*len(r.Headers)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// Fit leaves out of r, excess bytes over its cap, its key and the headers
// that shed allows (by index), the largest first, until it is not, and
// says their bytes in HeaderKeyHeadersOmitted. If r is still over, it cuts
// the value of header id (an index; -1: none) to the longest prefix that
// fits, and says the bytes cut in HeaderIDOmitted: the id is how a dead
// letter is counted and looked up, kept as whole as the cap lets it. The
// value is not Fit's to leave out: the caller does that first. It returns
// the bytes it left out of the key and headers, and of the id.
func Fit(r *kgo.Record, excess int, shed func(i int) bool, id int) (omitted, idOmitted int) {
	if excess <= 0 {
		return 0, 0
	}
	cands := []int{-1} // the key
	for i := range r.Headers {
		if i != id && shed(i) {
			cands = append(cands, i)
		}
	}
	sizeOf := func(i int) int {
		if i < 0 {
			return len(r.Key)
		}
		return len(r.Headers[i].Key) + len(r.Headers[i].Value) + 10
	}
	slices.SortStableFunc(cands, func(a, b int) int { return sizeOf(b) - sizeOf(a) })
	left := excess + note
	drop := make(map[int]bool, len(cands))
	for _, i := range cands {
		if left <= 0 {
			break
		}
		switch {
		case i >= 0:
			drop[i] = true
			omitted += sizeOf(i) - 10
			left -= sizeOf(i)
		case r.Key != nil:
			omitted += len(r.Key)
			left -= len(r.Key)
			r.Key = nil
		}
	}
	if omitted == 0 {
		left = excess // nothing left out, no header to say so
	}
	var idValue []byte
	if left > 0 && id >= 0 && id < len(r.Headers) {
		left += note
		v := string(r.Headers[id].Value)
		kept := prefix(v, len(v)-left)
		idOmitted = len(v) - len(kept)
		idValue = []byte(kept)
	}
	if omitted == 0 && idOmitted == 0 {
		return 0, 0
	}
	kept := r.Headers[:0:0]
	for i, h := range r.Headers {
		switch {
		case drop[i]:
		case i == id && idOmitted > 0:
			kept = append(kept, kgo.RecordHeader{Key: h.Key, Value: idValue})
		default:
			kept = append(kept, h)
		}
	}
	if omitted > 0 {
		kept = append(kept, kgo.RecordHeader{Key: HeaderKeyHeadersOmitted, Value: strconv.AppendInt(nil, int64(omitted), 10)})
	}
	if idOmitted > 0 {
		kept = append(kept, kgo.RecordHeader{Key: HeaderIDOmitted, Value: strconv.AppendInt(nil, int64(idOmitted), 10)})
	}
	r.Headers = kept
	return omitted, idOmitted
}
