//go:build faultinject

package faultinject

import (
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
)

// Vars are the environment variables of this build's crash points.
var Vars = []string{"WALRELAY_FAULT_KILL_AFTER_ACKS"}

var (
	acked      atomic.Int64
	crashAfter = func() int64 {
		n, _ := strconv.ParseInt(os.Getenv(Vars[0]), 10, 64)
		return n
	}()
)

// Acked is called after Kafka acknowledged an event and before the
// checkpoint learns of it. With WALRELAY_FAULT_KILL_AFTER_ACKS=N the process
// kills itself with SIGKILL at the Nth: Kafka has the event, PostgreSQL was
// never told.
func Acked() {
	if crashAfter > 0 && acked.Add(1) == crashAfter {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
