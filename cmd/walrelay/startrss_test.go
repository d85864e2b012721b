package main

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/waitfor"
)

// startRSSLimit bounds the peak resident set of a walrelay that has
// started and waits on its first connection to PostgreSQL: what every
// walrelay process holds before it streams anything, the part of the
// 64 MiB budget (docs/benchmarks.md) that no configuration lowers.
//
// Its basis, this test on the test's own build (go build, cgo on), Linux
// 6.18, 2 cores shared: 19.8 to 20.0 MiB at 53cf7f4 (before tracing and
// the schema-first formats), 30.3 to 32.6 MiB after them. Most of it is the
// binary's code and read-only data (text and rodata: 18.2 MiB at 53cf7f4,
// 29.4 after): every linked package's init touches its pages, and the
// kernel maps the file's pages around each fault, so nearly all of the
// binary is resident from the start (RssFile 26.9 MB a moment after start,
// measured during TestExactlyOnceLargeTransactionKilled), and the figure
// grows with the binary whether a feature is used or not. The limit leaves 3
// to 5 MiB to the noise of a loaded machine; a few MiB of code linked in
// crosses it.
const startRSSLimit = 36 << 20

// silentListener accepts connections and never answers on them: a
// PostgreSQL that walrelay waits on at its first connection.
func silentListener(t *testing.T) (addr string, accepted <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{})
	var (
		mu    sync.Mutex
		conns []net.Conn
		once  sync.Once
	)
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			once.Do(func() { close(ch) })
		}
	}()
	return l.Addr().String(), ch
}

// TestStartRSS: a walrelay that has started (configuration read, logger
// and metrics set up, tracing off) and waits on PostgreSQL holds under
// startRSSLimit (the least of three processes, for a noisy machine), so
// that a dependency which makes every walrelay larger is noticed when it
// is added, not by the exactly-once budget test weeks later.
func TestStartRSS(t *testing.T) {
	t.Parallel()
	if raceEnabled {
		t.Skip("the race detector's runtime and shadow memory are not the binary's")
	}
	least := int64(-1)
	for range 3 {
		addr, accepted := silentListener(t)
		p := start(t, env{
			"WALRELAY_POSTGRES_DSN":  "postgres://walrelay@" + addr + "/walrelay?sslmode=disable&connect_timeout=60",
			"WALRELAY_KAFKA_BROKERS": addr,
			"WALRELAY_KAFKA_TOPIC":   "outbox.event.{aggregatetype}",
			"WALRELAY_ADMIN_LISTEN":  "",
		}, "run")
		select {
		case <-accepted:
		case <-p.done:
			t.Fatalf("walrelay exited (%v) before connecting:\n%s", p.err, p.out.String())
		case <-time.After(30 * time.Second):
			t.Fatalf("walrelay did not connect to PostgreSQL within 30s:\n%s", p.out.String())
		}
		time.Sleep(100 * time.Millisecond) // what follows the dial, before the wait
		rss := p.peakRSS()
		p.kill()
		if rss <= 0 {
			t.Skip("no /proc/<pid>/status VmHWM on this platform")
		}
		if least < 0 || rss < least {
			least = rss
		}
	}
	t.Logf("walrelay waiting on its first connection: peak RSS %.1f MiB (least of 3)", float64(least)/(1<<20))
	if least > startRSSLimit {
		t.Fatalf("walrelay at start: peak RSS %.1f MiB, want under %d MiB: a package linked in costs every walrelay (GODEBUG=inittrace=1 walrelay version lists each package's init work; see startRSSLimit)",
			float64(least)/(1<<20), startRSSLimit>>20)
	}
}

// initAllocLimit bounds what every linked package's init allocates, summed
// (GODEBUG=inittrace=1): work that every walrelay process does at start,
// whatever its configuration, and part of its resident memory. Unlike the
// resident set, it does not vary from run to run. Its basis: 1.28 MB at
// 53cf7f4 (before tracing and the schema-first formats), 3.74 MB after
// them, of which 1.70 MB is santhosh-tekuri/jsonschema's init compiling
// the metaschemas of five drafts (a patched copy that compiles them on
// first use was tried and left out: a running walrelay's heap reuses that
// memory, so it saved nothing once walrelay streams, for 5,600 lines of a
// forked library). The next largest are cockroachdb/apd's constants (0.56
// MB), sink's topic name pattern and bufbuild/protocompile's standard
// imports (0.2 MB each). The limit leaves 0.7 MB for growth.
const initAllocLimit = 4_500_000

// TestInitAllocations: the packages' init work at start stays under
// initAllocLimit bytes; a dependency that builds a large global registry
// at init is named when it is added.
func TestInitAllocations(t *testing.T) {
	t.Parallel()
	if raceEnabled {
		t.Skip("the race detector's runtime allocates at init")
	}
	cmd := exec.CommandContext(t.Context(), walrelayBin, "version")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("walrelay version: %v\n%s", err, stderr.String())
	}
	type pkgInit struct {
		name  string
		bytes int64
	}
	var (
		inits []pkgInit
		total int64
	)
	// init github.com/x/y @1.2 ms, 0.5 ms clock, 1234 bytes, 5 allocs
	for line := range strings.Lines(stderr.String()) {
		f := strings.Fields(line)
		if len(f) < 11 || f[0] != "init" || f[8] != "bytes," {
			continue
		}
		n, err := strconv.ParseInt(f[7], 10, 64)
		if err != nil {
			t.Fatalf("inittrace line %q: %v", line, err)
		}
		inits = append(inits, pkgInit{f[1], n})
		total += n
	}
	if len(inits) == 0 {
		t.Fatalf("no inittrace lines in walrelay version's output:\n%s", stderr.String())
	}
	slices.SortFunc(inits, func(a, b pkgInit) int { return cmp.Compare(b.bytes, a.bytes) })
	var top strings.Builder
	for _, p := range inits[:min(5, len(inits))] {
		fmt.Fprintf(&top, "\n  %s: %d bytes", p.name, p.bytes)
	}
	t.Logf("init of %d packages: %d bytes; the largest:%s", len(inits), total, top.String())
	if total > initAllocLimit {
		t.Fatalf("the packages' init allocates %d bytes at every start, want at most %d (see initAllocLimit); the largest:%s", total, initAllocLimit, top.String())
	}
}

// memoryBudget is the peak RSS walrelay promises with the default
// settings, at any payload size (docs/benchmarks.md).
const memoryBudget = 64 << 20

// codeReserve is the binary's pages that streaming faults in after the
// start: RssFile is 24 to 25 MiB at the first connection and reached 26.9
// MB during TestExactlyOnceLargeTransactionKilled; the rest leaves room
// for a binary that grows by a few MiB (TestStartRSS names it first).
const codeReserve = 4 << 20

// TestMemoryBudget: the Go soft memory limit that walrelay sets by default
// (memory_limit: 0) bounds the runtime's memory (heap, stacks, metadata),
// not the binary's code and read-only data, which are resident beside it
// from the start (RssFile). The two together, with codeReserve, must fit
// the budget: a fast catch-up fills the runtime's memory up to the limit
// (it peaked at 61.6 to 65.6 MiB with the limit at 48 MiB, 2 ×
// kafka.max_buffered_bytes + 16 MiB, and about 27 MiB of the binary
// resident; an exactly-once catch-up of 512 KiB payloads at 68.4 MiB).
func TestMemoryBudget(t *testing.T) {
	t.Parallel()
	if raceEnabled {
		t.Skip("the race detector's runtime and shadow memory are not the binary's")
	}
	addr, accepted := silentListener(t)
	admin := freeAddr(t)
	p := start(t, env{
		"WALRELAY_POSTGRES_DSN":  "postgres://walrelay@" + addr + "/walrelay?sslmode=disable&connect_timeout=60",
		"WALRELAY_KAFKA_BROKERS": addr,
		"WALRELAY_KAFKA_TOPIC":   "outbox.event.{aggregatetype}",
		"WALRELAY_ADMIN_LISTEN":  admin,
	}, "run")
	defer p.kill()
	select {
	case <-accepted:
	case <-p.done:
		t.Fatalf("walrelay exited (%v) before connecting:\n%s", p.err, p.out.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("walrelay did not connect to PostgreSQL within 30s:\n%s", p.out.String())
	}
	var limit float64
	waitfor.Until(t, 30*time.Second, "go_gc_gomemlimit_bytes on /metrics", func() bool {
		resp, err := http.Get("http://" + admin + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var ok bool
		limit, ok = metricValue(string(b), "go_gc_gomemlimit_bytes")
		return ok
	})
	file := p.status("RssFile")
	if file <= 0 {
		t.Skip("no /proc/<pid>/status RssFile on this platform")
	}
	t.Logf("soft memory limit %.1f MiB, the binary's resident pages %.1f MiB and %d MiB to come: %.1f MiB of the %d MiB budget",
		limit/(1<<20), float64(file)/(1<<20), codeReserve>>20, (limit+float64(file+codeReserve))/(1<<20), memoryBudget>>20)
	if int64(limit)+file+codeReserve > memoryBudget {
		t.Fatalf("the default soft memory limit (%.1f MiB), the binary's resident pages (%.1f MiB) and %d MiB of them to come exceed the %d MiB budget: a catch-up that fills the runtime's memory to the limit passes it (see config.SoftMemoryLimit)",
			limit/(1<<20), float64(file)/(1<<20), codeReserve>>20, memoryBudget>>20)
	}
}
