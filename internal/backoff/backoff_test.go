package backoff

import (
	"testing"
	"time"
)

func TestWaitDoublesWithinBounds(t *testing.T) {
	t.Parallel()
	lo, hi := 100*time.Millisecond, 10*time.Second
	for n := range 40 {
		want := hi
		if n < 30 && lo<<n < hi {
			want = lo << n
		}
		for range 50 {
			if d := Wait(lo, hi, n); d < want/2 || d > want {
				t.Fatalf("Wait(%d) = %s, want within [%s, %s]", n, d, want/2, want)
			}
		}
	}
}
