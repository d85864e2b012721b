package relay

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/walrelay/walrelay/decoder"
)

// TestPersistentRefusalIsJudgedPerSession: only sessions that end on the
// same earliest refused event, with the same code, add up; a session that
// got further, one refused otherwise, or one without a refusal starts the
// count again.
func TestPersistentRefusalIsJudgedPerSession(t *testing.T) {
	t.Parallel()
	refused := func(at uint64, code *kerr.Error) *epoch {
		return &epoch{persistentAt: pglogrepl.LSN(at), persistentCode: code.Code, persistentErr: code}
	}
	for _, c := range []struct {
		name     string
		sessions []*epoch
		fatal    bool
	}{
		{"the same event five times", []*epoch{refused(10, kerr.PolicyViolation), refused(10, kerr.PolicyViolation), refused(10, kerr.PolicyViolation), refused(10, kerr.PolicyViolation), refused(10, kerr.PolicyViolation)}, true},
		{"four times", []*epoch{refused(10, kerr.PolicyViolation), refused(10, kerr.PolicyViolation), refused(10, kerr.PolicyViolation), refused(10, kerr.PolicyViolation)}, false},
		{"moving positions", []*epoch{refused(10, kerr.PolicyViolation), refused(20, kerr.PolicyViolation), refused(30, kerr.PolicyViolation), refused(40, kerr.PolicyViolation), refused(50, kerr.PolicyViolation)}, false},
		{"an earlier position", []*epoch{refused(10, kerr.PolicyViolation), refused(10, kerr.PolicyViolation), refused(5, kerr.PolicyViolation), refused(10, kerr.PolicyViolation), refused(10, kerr.PolicyViolation)}, false},
		{"another code between", []*epoch{refused(10, kerr.PolicyViolation), refused(10, kerr.PolicyViolation), refused(10, kerr.UnknownServerError), refused(10, kerr.PolicyViolation), refused(10, kerr.PolicyViolation)}, false},
		{"a session without a refusal between", []*epoch{refused(10, kerr.PolicyViolation), refused(10, kerr.PolicyViolation), {}, refused(10, kerr.PolicyViolation), refused(10, kerr.PolicyViolation), refused(10, kerr.PolicyViolation)}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := &pipeline{}
			var err error
			for _, s := range c.sessions {
				if err = p.persistentRefusal(s); err != nil {
					break
				}
			}
			if (err != nil) != c.fatal {
				t.Fatalf("err = %v, want fatal %v", err, c.fatal)
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
