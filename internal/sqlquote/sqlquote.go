package sqlquote

import (
	"strconv"
	"strings"
)

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

// Dollar returns body dollar-quoted (a DO block's or a function's body)
// with a tag that ends it only at its end: $$ or a name inside body (a
// quoted identifier may hold one) cannot close it early.
func Dollar(body string) string {
	tag := "$body$"
	for i := 1; strings.Index(body+tag, tag) != len(body); i++ {
		tag = "$body" + strconv.Itoa(i) + "$"
	}
	return tag + body + tag
}
