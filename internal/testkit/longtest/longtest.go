// Package longtest marks the long tests of every package: the fault suites
// that spend most of their time waiting out an outage, a partition, a slow
// broker or a chaos loop, the tests of scale (100,000-row transactions, 150
// MB payloads, thousands of schemas) and the tests of timing. The README's
// test command leaves them out to stay within its time; .ci/run runs them in
// a step of its own right after it, finding them by the line that marks
// them.
package longtest

import (
	"os"
	"runtime"
	"strings"
	"testing"
)

// Env, set to 1, runs the long tests too.
const Env = "WALRELAY_TEST_LONG"

// Skip skips t unless Env is 1 (and in -short mode). A long test calls it
// on a line of its own at the top of its function, as longtest.Skip(t) or
// through its package's one-line helper long(t) (cmd/walrelay's): .ci/run
// finds the long tests by that line, and Skip fails a test whose function
// did not call it itself.
func Skip(t *testing.T) {
	t.Helper()
	name := t.Name()
	if i := strings.IndexByte(name, '/'); i >= 0 {
		name = name[:i]
	}
	// 0 is runtime.Callers, 1 Skip, 2 the test or the package's long, 3
	// the test then.
	pcs := make([]uintptr, 2)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	caller, _ := frames.Next()
	if base(caller.Function) == "long" {
		caller, _ = frames.Next()
	}
	if base(caller.Function) != name {
		t.Fatalf("call long(t) or longtest.Skip(t) at the top of the test function %s itself (.ci/run finds the long tests by that line)", t.Name())
	}
	if testing.Short() {
		t.Skip("long test: not in -short mode")
	}
	if os.Getenv(Env) != "1" {
		t.Skip("long test: " + Env + "=1 runs it (.ci/run does)")
	}
}

func base(fn string) string { return fn[strings.LastIndex(fn, ".")+1:] }
