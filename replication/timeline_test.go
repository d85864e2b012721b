package replication

import (
	"testing"

	"github.com/jackc/pglogrepl"
)

// TestParseTimelineHistory reads the history file of timeline 3 as
// PostgreSQL writes it, and refuses a malformed one.
func TestParseTimelineHistory(t *testing.T) {
	ends, err := parseTimelineHistory([]byte("1\t0/3000158\tno recovery target specified\n\n# a comment\n2\t0/5000000\tbefore 2026-12-04 12:00:00+00\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ends) != 2 || ends[1] != pglogrepl.LSN(0x3000158) || ends[2] != pglogrepl.LSN(0x5000000) {
		t.Fatalf("ends %v", ends)
	}
	for _, bad := range []string{"1\n", "x\t0/1\n", "1\tnope\n", "0\t0/1\n"} {
		if _, err := parseTimelineHistory([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
