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
