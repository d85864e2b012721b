package kafkatest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/proxy"
)

// Node is one node of a RealCluster.
type Node struct {
	ID   int32
	Addr string // the client listener (its proxy), host:port

	// links are the proxies of the node's connections, either way: its
	// client listener's, its controller listener's for each other node,
	// and its own to each other controller.
	links  []*proxy.Proxy
	client *proxy.Proxy // its client listener's, among links

	dir, conf string
	java      string
	jvm       []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// trouble returns the last lines lines of the node's log that are warnings,
// errors or its start and stop.
func (n *Node) trouble(lines int) string {
	b, err := os.ReadFile(filepath.Join(n.dir, "stdout.log"))
	if err != nil {
		return err.Error()
	}
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "WARN") || strings.Contains(l, "ERROR") || strings.Contains(l, "FATAL") ||
			strings.Contains(l, "Exception") || strings.Contains(l, "started (kafka") || strings.Contains(l, "shut down") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep[max(0, len(keep)-lines):], "\n")
}

// Start starts the node (again: its data is kept).
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return fmt.Errorf("node %d runs", n.ID)
	}
	cmd, err := StartJava(n.dir, n.java, append(n.jvm, "kafka.Kafka", n.conf)...)
	if err != nil {
		return fmt.Errorf("start node %d: %w", n.ID, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	n.cmd, n.done = cmd, done
	return nil
}

// Kill kills the node with SIGKILL and waits until it is gone.
func (n *Node) Kill() { n.signalAndWait(syscall.SIGKILL, 0) }

// Stop stops the node with SIGTERM (a controlled shutdown, as a rolling
// restart does) and waits until it is gone, killing it after a minute.
func (n *Node) Stop() error {
	if !n.signalAndWait(syscall.SIGTERM, time.Minute) {
		return fmt.Errorf("node %d did not stop within a minute of SIGTERM: killed", n.ID)
	}
	return nil
}

// signalAndWait sends sig and waits for the exit, at most timeout (0: no
// limit) before SIGKILL; it reports whether the node exited in time.
func (n *Node) signalAndWait(sig syscall.Signal, timeout time.Duration) bool {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.cmd = nil
	n.mu.Unlock()
	if cmd == nil {
		return true
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a frozen node cannot act on SIGTERM
	_ = cmd.Process.Signal(sig)
	if timeout == 0 {
		<-done
		return true
	}
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		return false
	}
}

// Freeze stops the node's process (SIGSTOP): it keeps its connections and
// answers nothing, as a node cut off the network; Thaw resumes it.
func (n *Node) Freeze() error { return n.signal(syscall.SIGSTOP) }

// Cut cuts the node off the network while it runs: every connection to or
// from it, through the cluster's proxies, stays open and lets nothing
// through, and new ones are held without an answer, as a dead route does (no
// FIN, no reset). Mend ends it.
func (n *Node) Cut() {
	for _, p := range n.links {
		p.BlackHole()
	}
}

// Mend ends Cut: held connections are closed, silent ones pass again.
func (n *Node) Mend() {
	for _, p := range n.links {
		p.Up()
	}
}

// Slow delays every answer the node gives on its client listener by d (0
// ends it): to clients, and to the followers that fetch its partitions
// from it. What it fetches as a follower, and its controller links, are not
// slowed, so the partitions other nodes lead are as fast as before.
func (n *Node) Slow(d time.Duration) { n.client.Slow(d) }

// Thaw resumes a frozen node (SIGCONT).
func (n *Node) Thaw() error { return n.signal(syscall.SIGCONT) }

func (n *Node) signal(sig syscall.Signal) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return errors.New("the node does not run")
	}
	return n.cmd.Process.Signal(sig)
}
