package record

import (
	"fmt"
	"strings"
	"testing"
)

// TestRegexRouting: routing by a regex replaces groups as Java's
// Matcher.replaceFirst does, and a value the regex does not match whole is
// its own topic, as Kafka Connect's RegexRouter leaves it.
func TestRegexRouting(t *testing.T) {
	for _, c := range []struct{ regex, repl, value, want string }{
		{`(?<routedByValue>.*)`, "outbox.event.${routedByValue}", "order", "outbox.event.order"},
		{`(?<head>[a-z])(?<rest>[a-z]+)`, "events.${rest}.$1", "order", "events.rder.o"},
		{`(?<head>[a-z])(?<rest>[a-z]+)`, "events.${rest}.$1", "Order-1", "Order-1"}, // no match: the value itself
		{`([a-z]+)\.v(\d+)`, "$1-v$2", "billing.v2", "billing-v2"},
		{`([a-z]+)\.v(\d+)`, "$12", "billing.v2", "billing2"}, // group 12 does not exist: group 1, then "2"
		{`a|ab`, "x", "ab", "xb"},                     // replaceFirst finds "a", the first match, not the whole
		{`(x)?(order)`, "[$1]$2", "order", "[]order"}, // a group that took no part is empty
		{`(.*)`, `lit\$\\$1`, "o", `lit$\o`},          // escapes
	} {
		r, err := newRoute(c.repl, c.regex)
		if err != nil {
			t.Fatalf("%s / %s: %v", c.regex, c.repl, err)
		}
		for range 2 { // the second from the cache
			if got := r.router.topic(c.value); got != c.want {
				t.Fatalf("%s / %s on %q: %q, want %q", c.regex, c.repl, c.value, got, c.want)
			}
		}
	}
	for _, c := range []struct{ regex, repl, err string }{
		{`(?=x).*`, "t", "RE2"},
		{`(.*)`, "t.$2", "no group 2"},
		{`(.*)`, "t.${name}", `no group named "name"`},
		{`(.*)`, "t.$", "a $ at the end"},
		{`(.*)`, `t.\`, "a backslash at the end"},
		{`(.*)`, "t.$x", "$x"},
		{`(.*)`, "t.${a", "without its }"},
	} {
		if _, err := newRoute(c.repl, c.regex); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Fatalf("%s / %s: %v, want %q", c.regex, c.repl, err, c.err)
		}
	}
}

// TestRegexRouterCacheBounded: 10,000 distinct routing values do not grow
// the regex router's cache past its cap (the sink's topic cache:
// TestTopicCacheBounded).
func TestRegexRouterCacheBounded(t *testing.T) {
	t.Parallel()
	r, err := newRoute("outbox.$1", "(x.*)")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10000 {
		r.router.topic(fmt.Sprintf("value %d", i))
	}
	if got := r.router.cached.Load(); got > maxCachedRoutes {
		t.Fatalf("%d routing values remembered, want at most %d", got, maxCachedRoutes)
	}
}
