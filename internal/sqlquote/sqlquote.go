package sqlquote

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/walrelay/walrelay/internal/textcut"
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

// MaxNameBytes is the longest name PostgreSQL keeps (NAMEDATALEN - 1): a
// longer one is cut to its first 63 bytes, with a NOTICE only, so two
// names that share those bytes would name one object.
const MaxNameBytes = 63

// CheckName refuses a name that walrelay is to write into SQL (a schema,
// a table, a column, or a name it derives from one by adding a suffix):
// one that is empty, is not UTF-8, holds a control character (or a
// bidirectional one), or that,
// with the longest of suffixes, PostgreSQL would cut (MaxNameBytes). A
// name is always quoted where walrelay writes it (pgx.Identifier, and
// inside a function's body under a dollar tag the body does not hold:
// Dollar), so any other character, a '$' or a quote too, is taken as it
// is. The error quotes the name and says which rule it breaks.
func CheckName(name string, suffixes ...string) error {
	switch {
	case name == "":
		return errors.New("an empty name")
	case !utf8.ValidString(name):
		return fmt.Errorf("name %q is not UTF-8", name)
	}
	for _, r := range name {
		if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			// A bidirectional control (U+202E) makes a name print as
			// another in logs and commands.
			return fmt.Errorf("name %q holds the control character %U, which walrelay refuses in a name it writes into SQL", name, r)
		}
	}
	if len(name) > MaxNameBytes {
		return fmt.Errorf("name %q is %d bytes: PostgreSQL keeps the first %d bytes of a name (NAMEDATALEN 64) and cuts the rest", name, len(name), MaxNameBytes)
	}
	longest := ""
	for _, s := range suffixes {
		if len(s) > len(longest) {
			longest = s
		}
	}
	if len(name)+len(longest) > MaxNameBytes {
		return fmt.Errorf("name %q is %d bytes: walrelay names an object after it with %q, %d bytes in all, and PostgreSQL keeps the first %d bytes of a name (NAMEDATALEN 64), so two such names could name one object; take a name of at most %d bytes",
			name, len(name), longest, len(name)+len(longest), MaxNameBytes, MaxNameBytes-len(longest))
	}
	return nil
}

// Cut is name as PostgreSQL keeps it: its first MaxNameBytes bytes, cut
// before a character that would straddle the limit (as the server does
// in a UTF-8 database).
func Cut(name string) string { return textcut.Prefix(name, MaxNameBytes) }
