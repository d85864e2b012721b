package sqlquote

import "strings"

// Literal returns s as a PostgreSQL string literal that means s under
// either setting of standard_conforming_strings: quotes doubled, and, if s
// holds a backslash, backslashes doubled in an escape string (E'…'),
// whose backslashes are escapes in both settings. Doubling the quotes
// alone is not enough: with standard_conforming_strings off, a backslash
// in a plain literal escapes the next character, so 'a\' leaves the
// literal open and what follows is read as SQL.
func Literal(s string) string {
	q := strings.ReplaceAll(s, "'", "''")
	if !strings.Contains(s, `\`) {
		return "'" + q + "'"
	}
	return "E'" + strings.ReplaceAll(q, `\`, `\\`) + "'"
}
