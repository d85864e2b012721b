//go:build unix

package freeport

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// lockPath is the lock file of port p, shared by the processes using this
// package (the test binaries go test runs at once).
func lockPath(p int) string {
	return filepath.Join(os.TempDir(), "walrelay-ports", strconv.Itoa(p)+".lock")
}

// claim takes the cross-process claim of port p: an exclusive, non-blocking
// flock of its lock file, on a descriptor the caller keeps open for the
// life of the process. held is true when another process holds it (that
// port is not to be handed out). Where the lock file cannot be opened at
// all (no writable temporary directory) the port is handed out without a
// claim (f nil), as before this package had one, rather than no port.
func claim(p int) (f *os.File, held bool) {
	path := lockPath(p)
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, false
	}
	// As /tmp: any user's tests may claim ports there (this fails, and
	// does not matter, where the directory is another user's).
	_ = os.Chmod(dir, 0o777|os.ModeSticky)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		// Another user's lock file: a read-only descriptor takes a lock too.
		if f, err = os.Open(path); err != nil {
			return nil, false
		}
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	switch {
	case errors.Is(err, syscall.EWOULDBLOCK):
		f.Close()
		return nil, true
	case err != nil:
		f.Close()
		return nil, false
	}
	return f, false
}
