package record

import (
	"errors"
	"fmt"
	"strings"
)

// defaultReservedTopics are walrelay's own topics under their default
// names: the relay's dead-letter and offsets topics and the inbox's
// dead-letter topic. Another walrelay on the same cluster may use them even
// where this one is configured otherwise, so no event goes there either.
var defaultReservedTopics = []string{"walrelay.dlq", "walrelay.offsets", "walrelay.inbox.dlq"}

// topicRules say which topics an event may be routed to. A row chooses its
// topic through the routing value (the aggregate type), so without them a
// row could write to the dead-letter topic, to the offsets topic that
// exactly-once mode trusts, or to another application's topic.
type topicRules struct {
	reserved map[string]string // topic -> what it is, for the error
	exact    map[string]bool   // allowed topics; nil: any topic not reserved
	prefixes []string          // allowed prefixes (entries ending in *)
}

// CheckAllowedTopics checks the entries of Config.AllowedTopics as New
// does: each a legal topic name, or a prefix of one followed by *.
func CheckAllowedTopics(entries []string) error {
	_, err := newTopicRules(Config{AllowedTopics: entries})
	return err
}

// newTopicRules returns the rules of cfg.
func newTopicRules(cfg Config) (*topicRules, error) {
	r := &topicRules{reserved: map[string]string{}}
	for _, t := range defaultReservedTopics {
		r.reserved[t] = "a topic of walrelay's own"
	}
	for _, t := range cfg.ReservedTopics {
		r.reserved[t] = "a topic of walrelay's own"
	}
	if cfg.OffsetsTopic != "" {
		r.reserved[cfg.OffsetsTopic] = "the offsets topic of exactly-once mode"
	}
	if cfg.DLQTopic != "" {
		r.reserved[cfg.DLQTopic] = "the dead-letter topic"
	}
	for _, e := range cfg.AllowedTopics {
		if r.exact == nil {
			r.exact = map[string]bool{}
		}
		if p, ok := strings.CutSuffix(e, "*"); ok {
			// A prefix need not be a legal name alone ("orders." is), only
			// the start of one.
			if p == "" || !ValidTopic(p+"x") {
				return nil, fmt.Errorf("allowed topic %q: a prefix must be the non-empty start of a legal topic name, followed by *", e)
			}
			r.prefixes = append(r.prefixes, p)
			continue
		}
		if !ValidTopic(e) {
			return nil, fmt.Errorf("allowed topic %q is not a legal Kafka topic name (a prefix ends in *)", e)
		}
		if what, ok := r.reserved[e]; ok {
			return nil, fmt.Errorf("allowed topic %q is %s: no event may be routed there", e, what)
		}
		r.exact[e] = true
	}
	return r, nil
}

// errForbidden is why an event may not go to a topic (CheckTopic).
var errForbidden = errors.New("forbidden topic")

// check returns nil if an event may be routed to topic, a legal name, and
// else an error that says why not (wrapping errForbidden).
func (r *topicRules) check(topic string) error {
	if what, ok := r.reserved[topic]; ok {
		return fmt.Errorf("%w: %q is %s, never an event's topic", errForbidden, topic, what)
	}
	if strings.HasPrefix(topic, "__") {
		return fmt.Errorf("%w: %q is named as Kafka's internal topics are (__), never an event's topic", errForbidden, topic)
	}
	if r.exact == nil || r.exact[topic] {
		return nil
	}
	for _, p := range r.prefixes {
		if strings.HasPrefix(topic, p) {
			return nil
		}
	}
	return fmt.Errorf("%w: %q is not among the allowed topics", errForbidden, topic)
}

// CheckTopic returns nil if an event may be routed to topic, and else why
// not: it is not a legal name, or it is walrelay's own, Kafka's internal or
// outside Config.AllowedTopics.
func (b *Builder) CheckTopic(topic string) error {
	if !ValidTopic(topic) {
		return fmt.Errorf("topic %q is not a valid Kafka topic name", topic)
	}
	return b.rules.check(topic)
}

// RouteConfined reports whether a routing (a topic template, or with regex
// the regex and its replacement) keeps every topic under a prefix of its
// own: a template that starts with text does; a template that starts with
// a placeholder lets the row choose the start of the name, and a regex
// route makes a value it does not match the topic as it is. Without
// Config.AllowedTopics, such a route lets a row write to any topic but
// walrelay's own and Kafka's internal ones.
func RouteConfined(topic, regex string) bool {
	if regex != "" {
		return false
	}
	return !strings.HasPrefix(topic, "{")
}
