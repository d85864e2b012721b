package record

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/walrelay/walrelay/event"
)

var topicRe = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// ValidTopic reports whether name is a legal Kafka topic name.
func ValidTopic(name string) bool { return topicRe.MatchString(name) && name != "." && name != ".." }

// CheckRouting checks a topic template, or with a regex (Config.TopicRegex)
// the regex and its replacement, as New does.
func CheckRouting(topic, regex string) error {
	_, err := newRoute(topic, regex)
	return err
}

// Route is how the events of one outbox table are routed, when not by
// Config.Topic and Config.TopicRegex: a topic template, or with TopicRegex
// a regex and its replacement (as Config's).
type Route struct{ Topic, TopicRegex string }

// route is a Route made ready: the template split, or the regex router.
type route struct {
	template string
	parts    []string     // the template split at its placeholders: text, placeholder, text, …
	router   *regexRouter // routes instead of parts when a regex is set
}

// newRoute checks the routing settings and returns their route.
func newRoute(topic, regex string) (*route, error) {
	if regex != "" {
		router, err := newRegexRouter(regex, topic)
		if err != nil {
			return nil, err
		}
		return &route{template: topic, router: router}, nil
	}
	probe := strings.NewReplacer("{aggregatetype}", "x", "{type}", "x").Replace(topic)
	if strings.ContainsAny(probe, "{}") || !ValidTopic(probe) {
		return nil, fmt.Errorf("topic template %q: only {aggregatetype} and {type} may be replaced, and the rest must be legal in a topic name", topic)
	}
	return &route{template: topic, parts: splitTemplate(topic)}, nil
}

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

func (r *route) topic(e *event.Event) string {
	if r.router != nil {
		return r.router.topic(e.AggregateType)
	}
	if len(r.parts) == 1 {
		return r.parts[0]
	}
	if len(r.parts) == 3 && r.parts[2] == "" {
		// The common shape, prefix{placeholder}: one concatenation.
		return r.parts[0] + field(r.parts[1], e)
	}
	var b strings.Builder
	for i, p := range r.parts {
		if i%2 == 0 {
			b.WriteString(p)
		} else {
			b.WriteString(field(p, e))
		}
	}
	return b.String()
}

func field(placeholder string, e *event.Event) string {
	if placeholder == "{type}" {
		return e.Type
	}
	return e.AggregateType
}

// regexRouter routes as Debezium's outbox EventRouter does with
// route.topic.regex and route.topic.replacement (Kafka Connect's
// RegexRouter): a routing value that the expression matches whole becomes
// the value with its first match replaced by the replacement, in which
// $n and ${name} are groups and a backslash escapes the next character; a
// value that does not match is the topic as it is.
type regexRouter struct {
	whole, first *regexp.Regexp // anchored for the test, unanchored for the replacement
	repl         []replPart
	cache        sync.Map // routing value -> topic
	cached       atomic.Int32
}

// replPart is a literal (group < 0) or a group reference of a replacement.
type replPart struct {
	text  string
	group int
}

// maxCachedRoutes bounds the routing values whose topic is remembered: a
// stream has few.
const maxCachedRoutes = 4096

func newRegexRouter(expr, replacement string) (*regexRouter, error) {
	first, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("topic regex %q (Go's RE2 syntax: no lookaround or backreferences): %w", expr, err)
	}
	r := &regexRouter{first: first, whole: regexp.MustCompile(`^(?:` + expr + `)$`)}
	if r.repl, err = parseReplacement(replacement, first); err != nil {
		return nil, fmt.Errorf("topic replacement %q: %w", replacement, err)
	}
	return r, nil
}

// parseReplacement reads a replacement as java.util.regex.Matcher does: a
// backslash takes the next character literally; $ is followed by {name} or
// by digits, of which it takes as many as still name a group of re.
func parseReplacement(s string, re *regexp.Regexp) ([]replPart, error) {
	var parts []replPart
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			parts = append(parts, replPart{text: lit.String(), group: -1})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			if i++; i == len(s) {
				return nil, errors.New("a backslash at the end escapes nothing")
			}
			lit.WriteByte(s[i])
		case '$':
			if i++; i == len(s) {
				return nil, errors.New("a $ at the end names no group")
			}
			g := 0
			if s[i] == '{' {
				j := strings.IndexByte(s[i:], '}')
				if j < 0 {
					return nil, errors.New("a ${ without its }")
				}
				name := s[i+1 : i+j]
				if g = re.SubexpIndex(name); name == "" || g < 0 {
					return nil, fmt.Errorf("no group named %q in the expression", name)
				}
				i += j
			} else {
				if s[i] < '0' || s[i] > '9' {
					return nil, fmt.Errorf("$%c: a $ must be followed by a group number or {name} (\\$ is a dollar)", s[i])
				}
				if g = int(s[i] - '0'); g > re.NumSubexp() {
					return nil, fmt.Errorf("no group %d in the expression", g)
				}
				for i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9' {
					n := g*10 + int(s[i+1]-'0')
					if n > re.NumSubexp() {
						break
					}
					g = n
					i++
				}
			}
			flush()
			parts = append(parts, replPart{group: g})
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	return parts, nil
}

// topic returns the topic of routing value v.
func (r *regexRouter) topic(v string) string {
	if t, ok := r.cache.Load(v); ok {
		return t.(string)
	}
	t := v
	if r.whole.MatchString(v) {
		// Matcher.replaceFirst searches again from the start: the first
		// match found may be shorter than the whole value.
		m := r.first.FindStringSubmatchIndex(v)
		var b strings.Builder
		b.WriteString(v[:m[0]])
		for _, p := range r.repl {
			switch {
			case p.group < 0:
				b.WriteString(p.text)
			case m[2*p.group] >= 0:
				b.WriteString(v[m[2*p.group]:m[2*p.group+1]])
			}
		}
		b.WriteString(v[m[1]:])
		t = b.String()
	}
	if r.cached.Load() < maxCachedRoutes {
		if _, loaded := r.cache.LoadOrStore(v, t); !loaded {
			r.cached.Add(1)
		}
	}
	return t
}
