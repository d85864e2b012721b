package config

import (
	"errors"
	"fmt"
	"strings"
)

// Problems are the mistakes found in a configuration, reported together:
// each unknown key and refused value of the file, the environment and the
// flags, so that one run names them all.
type Problems []error

func (p *Problems) add(err error) {
	var more Problems
	switch {
	case err == nil:
	case errors.As(err, &more):
		*p = append(*p, more...)
	default:
		*p = append(*p, err)
	}
}

// Err is nil without problems, the one problem, or p.
func (p Problems) Err() error {
	switch len(p) {
	case 0:
		return nil
	case 1:
		return p[0]
	}
	return p
}

// Error names every problem, one a line after a count.
func (p Problems) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d mistakes in the configuration:", len(p))
	for _, e := range p {
		b.WriteString("\n  " + e.Error())
	}
	return b.String()
}

// Unwrap gives the problems to errors.Is and errors.As.
func (p Problems) Unwrap() []error { return p }

// suggest names a known key that n is probably a misspelling of.
func (cs *Set) suggest(n string) string {
	names := make([]string, len(cs.keys))
	for i, k := range cs.keys {
		names[i] = k.name
	}
	if best := Suggest(n, names); best != "" {
		return " (did you mean " + best + "?)"
	}
	return ""
}

// Suggest returns the one of names that n is probably a misspelling of
// (fewer than 4 edits away, the closest), or "".
func Suggest(n string, names []string) string {
	best, bestD := "", 4
	for _, k := range names {
		if d := editDistance(n, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
