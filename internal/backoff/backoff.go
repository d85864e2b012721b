// Package backoff computes capped exponential backoff with jitter, the one
// retry schedule of walrelay (reconnecting to PostgreSQL, retrying Kafka).
package backoff

import (
	"math/rand/v2"
	"time"
)

// Wait returns the wait before retry n (from 0): lo·2ⁿ capped at hi, drawn
// uniformly from its upper half so that instances do not retry in step.
func Wait(lo, hi time.Duration, n int) time.Duration {
	d := hi
	if n >= 0 && n < 30 && lo<<n < hi {
		d = lo << n
	}
	return d/2 + rand.N(d/2+1)
}
