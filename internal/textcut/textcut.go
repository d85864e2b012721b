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
