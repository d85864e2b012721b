// Package properties reads the text format of java.util.Properties, which
// Debezium's configuration files and its outbox's trace context column are
// written in.
package properties

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
)

// Parse reads java.util.Properties' text format: key=value or
// key:value or key value, # and ! comments, backslash line continuations
// and escapes.
func Parse(data []byte) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	var logical strings.Builder
	for sc.Scan() {
		line := strings.TrimLeft(sc.Text(), " \t\f")
		if logical.Len() == 0 && (line == "" || line[0] == '#' || line[0] == '!') {
			continue
		}
		// An odd number of trailing backslashes continues the line.
		n := len(line) - len(strings.TrimRight(line, `\`))
		if n%2 == 1 {
			logical.WriteString(line[:len(line)-1])
			continue
		}
		logical.WriteString(line)
		k, v := splitProperty(logical.String())
		logical.Reset()
		out[unescape(k)] = unescape(v)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

func splitProperty(s string) (string, string) {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '=', ':', ' ', '\t':
			k := s[:i]
			rest := strings.TrimLeft(s[i:], " \t")
			if rest != "" && (rest[0] == '=' || rest[0] == ':') {
				rest = strings.TrimLeft(rest[1:], " \t")
			}
			return k, rest
		}
	}
	return s, ""
}

func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		i++
		switch s[i] {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'u':
			if i+4 < len(s) {
				if r, err := strconv.ParseUint(s[i+1:i+5], 16, 32); err == nil {
					b.WriteRune(rune(r))
					i += 4
					continue
				}
			}
			b.WriteByte('u')
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}
