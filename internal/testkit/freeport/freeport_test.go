package freeport

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestGetOutsideTheEphemeralRange(t *testing.T) {
	ports, err := Get(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	high := ephemeralLow()
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d twice in %v", p, ports)
		}
		seen[p] = true
		if high-low >= 1000 && (p < low || p >= high) {
			t.Fatalf("port %d outside [%d, %d)", p, low, high)
		}
	}
}

// TestGetNeverHandsOutAPortTwice: One drew at random among some 12,768
// ports with no record of those it handed out, so tests run in parallel,
// each given a port its server binds a moment later, were given the same
// port (review44's TestProbe44ParallelTestsSamePort: 10 of 2,560 binds
// refused with EADDRINUSE). 600 ports asked from 8 goroutines at once
// are distinct (drawn at random they would repeat some 14 times).
func TestGetNeverHandsOutAPortTwice(t *testing.T) {
	const goroutines, each = 8, 75
	var mu sync.Mutex
	seen := map[int]int{}
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				p, err := One()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				seen[p]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for p, n := range seen {
		if n > 1 {
			t.Errorf("port %d handed out %d times", p, n)
		}
	}
	if len(seen) != goroutines*each && !t.Failed() {
		t.Errorf("%d ports, want %d", len(seen), goroutines*each)
	}
}

// childEnv makes this test binary, run again, the other process of
// TestGetSkipsAPortClaimedByAnotherProcess.
const childEnv = "WALRELAY_FREEPORT_TEST_CHILD"

// TestGetSkipsAPortClaimedByAnotherProcess: go test runs several test
// binaries at once, each starting its servers on ports of this package. A
// port handed out to another process, whose claim (a flock of its lock
// file) that process holds, is not handed out, though nothing listens on
// it yet; when that process dies (killed here, as a crashed test binary),
// the kernel releases its claim and the port can be handed out again.
func TestGetSkipsAPortClaimedByAnotherProcess(t *testing.T) {
	if os.Getenv(childEnv) == "1" {
		// The other process: take a port, say which, hold it until killed.
		p, err := One()
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(p)
		select {}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestGetSkipsAPortClaimedByAnotherProcess$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the child's port: %v (%q)", err, line)
	}
	claimed, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("the child's port: %q", line)
	}
	// Nothing listens on it: only the child's claim keeps it from us.
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(claimed))
	if err != nil {
		t.Fatalf("the child's port %d is bound: %v", claimed, err)
	}
	l.Close()

	// Draw the child's port first, then at random.
	draws := 0
	old := pick
	t.Cleanup(func() { pick = old })
	pick = func(lo, hi int) int {
		draws++
		if draws <= 3 {
			return claimed
		}
		return old(lo, hi)
	}
	p, err := One()
	if err != nil {
		t.Fatal(err)
	}
	if p == claimed || draws < 4 {
		t.Fatalf("One gave %d after %d draws, want a port other than %d, which another process holds", p, draws, claimed)
	}

	// The child killed, its claim is released.
	cmd.Process.Kill()
	cmd.Wait()
	draws = 0
	p, err = One()
	if err != nil {
		t.Fatal(err)
	}
	if p != claimed {
		t.Errorf("One gave %d, want %d: its process was killed, its claim released", p, claimed)
	}
}
