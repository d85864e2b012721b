// Package freeport picks TCP ports on the loopback interface for the servers
// the tests start (PostgreSQL, Kafka nodes, registries, Jaeger).
//
// The ports are taken below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), never from it: a port the kernel hands
// out for outgoing connections can be taken, as the local end of some
// connection, while a server that owns it is down, and then that server
// cannot start again on it (a Kafka node killed and restarted, a
// PostgreSQL restarted). A port asked of the kernel with port 0 is in that
// range; a port below it is never used by an outgoing connection.
//
// A port is free when it is handed out, but its server binds it later (a
// PostgreSQL, a Java registry or Kafka node takes 0.5 to 20 s to start),
// and tests run in parallel, in one test binary and in several (go test
// runs packages at once). So a port is never handed out twice: not twice
// in a process (a set of the ports handed out), and not by two processes
// at once (a claim held for the life of the process: an exclusive flock(2)
// of /tmp/walrelay-ports/<port>.lock on a descriptor never closed, which
// the kernel releases when the process exits, crashed or not). Drawing at
// random with no record, two tests whose servers were both starting were
// given the same port.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// low is the lowest port picked: above the well-known and most registered
// services' ports a test machine may run.
const low = 20000

var (
	// mu serializes Get: the check of handed and the claim of a port are
	// one step.
	mu sync.Mutex
	// handed holds the ports this process has handed out, each with its
	// claim (the open lock file, nil where none could be taken), kept
	// open, so held, until the process exits.
	handed = map[int]*os.File{}
	// pick draws a port in [lo, hi); a variable for the tests, which make
	// it draw a port they chose.
	pick = func(lo, hi int) int { return lo + rand.IntN(hi-lo) }
)

// Get returns n distinct ports, free on 127.0.0.1 a moment ago and outside
// the ephemeral range, that no other call of Get in this process and no
// other process using this package (whose claim is still held) was
// given. Where that range leaves too little room below it, the ports are
// the kernel's own (port 0), as before, still never handed out twice.
func Get(n int) ([]int, error) {
	mu.Lock()
	defer mu.Unlock()
	ports := make([]int, 0, n)
	high := ephemeralLow()
	for tries := 0; len(ports) < n; tries++ {
		p := 0
		if high-low >= 1000 && tries < 1000 {
			p = pick(low, high)
			if _, ok := handed[p]; ok {
				continue // this process's already
			}
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			if p == 0 {
				return nil, fmt.Errorf("find a free port: %w", err)
			}
			continue // taken: another one
		}
		p = l.Addr().(*net.TCPAddr).Port
		if _, ok := handed[p]; ok {
			l.Close()
			continue // the kernel's port 0 gave one handed out before
		}
		// Claimed while the listener holds the port: a process whose
		// claim is held may not have bound it yet.
		f, held := claim(p)
		l.Close()
		if held {
			continue // another process's
		}
		handed[p] = f
		ports = append(ports, p)
	}
	return ports, nil
}

// One returns one port as Get does.
func One() (int, error) {
	p, err := Get(1)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default 32768 where it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	p, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return p
}
