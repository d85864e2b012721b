package relay

import "time"

// SetBrokersWaitWarnEvery sets how often WaitForBrokers repeats its WARN
// line, and returns the function that restores it.
func SetBrokersWaitWarnEvery(d time.Duration) (restore func()) {
	was := brokersWaitWarnEvery
	brokersWaitWarnEvery = d
	return func() { brokersWaitWarnEvery = was }
}
