package relay

import (
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kerr"
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
