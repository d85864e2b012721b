// Package waitfor waits in tests for a condition instead of for a time: the
// machines the tests run on are shared and their speed varies.
package waitfor

import (
	"testing"
	"time"
)

// Until polls cond, every 5 ms at first and every 50 ms at most, until it
// holds; after timeout it fails the test with what it waited for.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := 5 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// NoError calls f, every 5 ms at first and every second at most, until it
// returns nil; after timeout it fails the test with what it tried and f's
// last error. It is for a request a cluster in the middle of a fault may
// refuse for a while (a node restarting, a leader moving).
func NoError(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := 5 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %s: %v", what, timeout, err)
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Second)
	}
}
