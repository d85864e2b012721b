package relay

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/walrelay/walrelay/decoder"
)

// TestPersistentRefusalIsJudgedPerSession: only sessions that end on the
// same earliest refused event, with the same code, add up; a session that
// got further, one refused otherwise, or one without a refusal starts the
// count again. A persistent refusal stops the relay only after
// maxPersistent sessions over persistentSpan; one a healthy cluster
// answers with for a while (UNKNOWN_SERVER_ERROR, retriable codes) never.
func TestPersistentRefusalIsJudgedPerSession(t *testing.T) {
	t.Parallel()
	refused := func(at uint64, code *kerr.Error) *epoch {
		return &epoch{refusedAt: pglogrepl.LSN(at), refusedCode: code.Code, refusedErr: code}
	}
	times := func(n int, s *epoch) []*epoch {
		out := make([]*epoch, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	pv := kerr.PolicyViolation
	for _, c := range []struct {
		name     string
		every    time.Duration // between two sessions' ends
		sessions []*epoch
		fatal    bool
	}{
		{"the same event five times over the span", persistentSpan / 4, times(5, refused(10, pv)), true},
		{"the same event five times in a second: a hiccup", 200 * time.Millisecond, times(5, refused(10, pv)), false},
		{"a hundred times within the span", persistentSpan / 200, times(100, refused(10, pv)), false},
		{"four times over twice the span", persistentSpan, times(4, refused(10, pv)), false},
		{"unknown server error for ten minutes", 10 * time.Second, times(60, refused(10, kerr.UnknownServerError)), false},
		{"a coordinator moving for ten minutes", 10 * time.Second, times(60, refused(10, kerr.NotCoordinator)), false},
		{"throttled for ten minutes", 10 * time.Second, times(60, refused(10, kerr.ThrottlingQuotaExceeded)), false},
		{"moving positions", persistentSpan, []*epoch{refused(10, pv), refused(20, pv), refused(30, pv), refused(40, pv), refused(50, pv)}, false},
		{"an earlier position", persistentSpan, []*epoch{refused(10, pv), refused(10, pv), refused(5, pv), refused(10, pv), refused(10, pv)}, false},
		{"another code between", persistentSpan, []*epoch{refused(10, pv), refused(10, pv), refused(10, kerr.UnknownServerError), refused(10, pv), refused(10, pv)}, false},
		{"a session without a refusal between", persistentSpan, []*epoch{refused(10, pv), refused(10, pv), {}, refused(10, pv), refused(10, pv), refused(10, pv)}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			now := time.Unix(1e9, 0)
			var log bytes.Buffer
			p := &pipeline{now: func() time.Time { return now }, log: slog.New(slog.NewTextHandler(&log, nil))}
			var err error
			for _, s := range c.sessions {
				now = now.Add(c.every)
				if err = p.persistentRefusal(s); err != nil {
					break
				}
			}
			if (err != nil) != c.fatal {
				t.Fatalf("err = %v, want fatal %v", err, c.fatal)
			}
			if c.sessions[0].refusedAt != 0 && !strings.Contains(log.String(), "kafka refuses an event") {
				t.Fatalf("the refusal is not logged:\n%s", log.String())
			}
		})
	}
}

// TestIgnoredPrefixesAreLoggedOnceAndBounded: each prefix of an ignored
// message is logged once; since any role chooses them, at most
// maxPrefixesLogged are remembered and logged, then one line says that
// further ones are only counted.
func TestIgnoredPrefixesAreLoggedOnceAndBounded(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	p := &pipeline{log: slog.New(slog.NewTextHandler(&buf, nil))}
	for round := range 2 {
		for i := range maxPrefixesLogged + 50 {
			p.ignoredMessage(decoder.Ignored{Kind: "message_foreign_prefix", Prefix: fmt.Sprintf("p%d", i)}, pglogrepl.LSN(round*1000+i))
		}
	}
	lines := strings.Count(buf.String(), "\n")
	if once := strings.Count(buf.String(), "prefix=p7 "); once != 1 || lines != maxPrefixesLogged+1 || !strings.Contains(buf.String(), "further prefixes are counted, not logged") {
		t.Fatalf("%d lines (p7 %d times), want %d and one about the rest:\n%s", lines, once, maxPrefixesLogged+1, buf.String())
	}
	if len(p.prefixesLogged) > maxPrefixesLogged+1 {
		t.Fatalf("%d prefixes remembered", len(p.prefixesLogged))
	}
}

// TestIgnoredPrefixesHeldBoundedByBytes: a prefix of an ignored message
// may be megabytes (any role chooses it, and a message under
// postgres.max_message_bytes is read whole); what the pipeline remembers
// of the prefixes it logged is bounded in bytes, not only in number.
func TestIgnoredPrefixesHeldBoundedByBytes(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	p := &pipeline{log: slog.New(slog.NewTextHandler(&buf, nil))}
	const size = 100 << 10
	for i := range maxPrefixesLogged + 50 {
		p.ignoredMessage(decoder.Ignored{Kind: "message_foreign_prefix", Prefix: fmt.Sprintf("%d", i) + strings.Repeat("x", size)}, pglogrepl.LSN(i))
	}
	held := 0
	for k := range p.prefixesLogged {
		held += len(k)
	}
	if limit := (maxPrefixesLogged + 1) * 512; held > limit {
		t.Fatalf("%d bytes of prefixes held, want at most %d", held, limit)
	}
	if len(buf.String()) > (maxPrefixesLogged+1)*1024 {
		t.Fatalf("%d bytes logged", len(buf.String()))
	}
}
