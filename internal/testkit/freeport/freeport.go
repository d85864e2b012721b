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
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// low is the lowest port picked: above the well-known and most registered
// services' ports a test machine may run.
const low = 20000

// Get returns n distinct ports, free on 127.0.0.1 a moment ago and outside
// the ephemeral range. Where that range leaves too little room below it,
// the ports are the kernel's own (port 0), as before.
func Get(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	high := ephemeralLow()
	for tries := 0; len(ports) < n; tries++ {
		addr := "127.0.0.1:0"
		if high-low >= 1000 && tries < 1000 {
			addr = "127.0.0.1:" + strconv.Itoa(low+rand.IntN(high-low))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			if addr == "127.0.0.1:0" {
				return nil, fmt.Errorf("find a free port: %w", err)
			}
			continue // taken: another one
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
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
