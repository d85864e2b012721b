//go:build faultinject

package faultinject

import (
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// Vars are the environment variables of this build's crash points.
var Vars = []string{"WALRELAY_FAULT_KILL_AFTER_ACKS", "WALRELAY_FAULT_KILL_AT"}

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

var (
	reached          atomic.Int64
	killPoint, killN = func() (string, int64) {
		p, n, _ := strings.Cut(os.Getenv(Vars[1]), ":")
		k, _ := strconv.ParseInt(n, 10, 64)
		return p, k
	}()
)

// Reached is called at a named point of the data path. With
// WALRELAY_FAULT_KILL_AT=point:N the process kills itself with SIGKILL the
// Nth time it reaches point. The points: txn_events_flushed (exactly-once:
// a transaction's events flushed, its position record not yet produced),
// txn_position_flushed (its position record flushed, the commit not yet
// asked for).
func Reached(point string) {
	if point == killPoint && reached.Add(1) == killN {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}
