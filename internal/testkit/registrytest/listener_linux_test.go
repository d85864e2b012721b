package registrytest

import (
	"net"
	"os"
	"os/exec"
	"testing"
)

// TestListensTellsWhoseListener: New takes a ready answer on its port as
// its registry's only if the registry's process holds the port's
// listener, not another server that took the port first. listens finds
// this process's listener, and not a child's that holds none.
func TestListensTellsWhoseListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	if ok, known := listens(os.Getpid(), port); !ok || !known {
		t.Errorf("listens(this process, %d) = %v, %v; want true, true", port, ok, known)
	}
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		other.Process.Kill()
		other.Wait()
	}()
	if ok, known := listens(other.Process.Pid, port); ok || !known {
		t.Errorf("listens(another process, %d) = %v, %v; want false, true", port, ok, known)
	}
	l.Close()
	if ok, known := listens(os.Getpid(), port); ok || !known {
		t.Errorf("listens(this process, %d) after its listener closed = %v, %v; want false, true", port, ok, known)
	}
}
