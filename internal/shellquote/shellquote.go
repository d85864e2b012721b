// Package shellquote writes a value into a command line that walrelay
// prints for an operator to run (the reconcile or replay a refusal
// suggests), so that pasting it into a POSIX shell passes the value as
// one argument, as it is: a table named `x; rm -rf ~` or with a `$(…)`
// stays a name.
package shellquote

import (
	"regexp"
	"strings"
)

var plain = regexp.MustCompile(`^[A-Za-z0-9_./:@%+=,-]+$`)

// Arg returns s as one argument of a POSIX shell command line: as it is
// if it holds only characters no shell reads specially, else in single
// quotes (a single quote inside written '\”).
func Arg(s string) string {
	if plain.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
