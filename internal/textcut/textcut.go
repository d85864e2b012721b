// Package textcut is the one way walrelay shortens text that it writes
// where a bound holds (an error quoting a registry's answer or a payload,
// a dead letter's headers, a span's attribute, a name as PostgreSQL keeps
// it): at a character boundary, so that what it writes is still UTF-8 when
// the text was.
package textcut

import "unicode/utf8"

// Prefix returns the longest prefix of s of at most n bytes that ends at
// a character boundary (s itself if it is no longer than n; "" if n <= 0).
func Prefix(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if n >= len(s) {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Clip returns s if it is at most n bytes, else Prefix(s, n) followed by
// an ellipsis, which marks the cut.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Prefix(s, n) + "…"
}

// MaxID is the most bytes of an id (an event's, an aggregate's) that a log
// line or an error quotes: an id is whatever a writer wrote (8,000
// characters are a valid text id), and quoted whole it would make every
// line about it that long.
const MaxID = 128

// ID is id as a log line or an error quotes it: Clip(id, MaxID).
func ID(id string) string { return Clip(id, MaxID) }
