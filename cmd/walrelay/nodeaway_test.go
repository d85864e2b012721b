package main

import (
	"strings"
	"testing"
	"time"
)

// TestNodeAwayReadsAsOne: the broker, which answered, accepts connections
// and closes them at once for 4 s, as a node does while it restarts, and
// rows are written meanwhile. The client's lines about each connection
// (ERROR "unable to request api versions", WARN "... (is TLS
// misconfigured?)": 91 of each in one nemesis run) come as one line of
// walrelay's naming the node, without the TLS hint, and one when it is back;
// nothing is lost.
func TestNodeAwayReadsAsOne(t *testing.T) {
	t.Parallel()
	_, col, fk, conn, w, p, _ := warmStreamWith(t, 48, 200)
	fk.Down()
	if err := w.write(t.Context(), conn, 200, 10); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second)
	fk.Up()
	c := waitAll(t, col, w.written(), 2*time.Minute)
	for at := time.Now(); !strings.Contains(p.out.String(), " is back") && time.Since(at) < 30*time.Second; {
		time.Sleep(100 * time.Millisecond)
	}
	var tlsHints, apiErrors, unreachable, back int
	var lines []string
	for _, l := range strings.Split(p.out.String(), "\n") {
		switch {
		case strings.Contains(l, "TLS misconfigured") && strings.Contains(l, "level=WARN"):
			tlsHints++
		case strings.Contains(l, "unable to request api versions") && strings.Contains(l, "level=ERROR"):
			apiErrors++
		case strings.Contains(l, "is unreachable") && strings.Contains(l, "level=WARN"):
			unreachable++
		case strings.Contains(l, " is back"):
			back++
		default:
			continue
		}
		lines = append(lines, l)
	}
	t.Logf("a node away for 4 s: %s; the lines about it:\n%s", c, strings.Join(lines, "\n"))
	if tlsHints != 0 || apiErrors != 0 {
		t.Errorf("%d WARN lines asking whether TLS is misconfigured and %d ERROR lines about api versions for a node that answered before", tlsHints, apiErrors)
	}
	if unreachable != 1 || back != 1 {
		t.Errorf("%d lines saying the node is unreachable and %d that it is back, want one of each", unreachable, back)
	}
	if c.orderViolations != 0 || c.missing != 0 {
		t.Fatalf("after a node away for 4 s: %s", c)
	}
}
