package sink

import (
	"regexp"
	"strings"

	"github.com/walrelay/walrelay/event"
)

var topicRe = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// ValidTopic reports whether name is a legal Kafka topic name.
func ValidTopic(name string) bool { return topicRe.MatchString(name) && name != "." && name != ".." }

// splitTemplate splits a topic template into literal text at even indexes
// and placeholders at odd ones.
func splitTemplate(t string) []string {
	var parts []string
	for {
		i := strings.IndexByte(t, '{')
		j := strings.IndexByte(t, '}')
		if i < 0 || j < i {
			return append(parts, t)
		}
		parts = append(parts, t[:i], t[i:j+1])
		t = t[j+1:]
	}
}

// Topic returns the topic an event is routed to.
func (s *Sink) Topic(e *event.Event) string {
	if len(s.parts) == 1 {
		return s.parts[0]
	}
	if len(s.parts) == 3 && s.parts[2] == "" {
		// The common shape, prefix{placeholder}: one concatenation.
		return s.parts[0] + s.field(s.parts[1], e)
	}
	var b strings.Builder
	for i, p := range s.parts {
		if i%2 == 0 {
			b.WriteString(p)
		} else {
			b.WriteString(s.field(p, e))
		}
	}
	return b.String()
}

func (s *Sink) field(placeholder string, e *event.Event) string {
	if placeholder == "{type}" {
		return e.Type
	}
	return e.AggregateType
}
