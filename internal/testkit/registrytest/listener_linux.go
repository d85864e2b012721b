package registrytest

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// listens reports whether process pid holds a TCP listener on port, from
// /proc/net/tcp{,6} (the listeners' socket inodes) and /proc/<pid>/fd (the
// process's sockets). known is false where /proc cannot tell.
func listens(pid, port int) (ok, known bool) {
	inodes := map[string]bool{}
	read := false
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		read = true
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st ... inode: the address as
			// hex IP:hex port, LISTEN is st 0A.
			cols := strings.Fields(sc.Text())
			if len(cols) < 10 || cols[3] != "0A" {
				continue
			}
			_, hexPort, _ := strings.Cut(cols[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) == port {
				inodes[cols[9]] = true
			}
		}
		f.Close()
	}
	if !read {
		return false, false
	}
	if len(inodes) == 0 {
		return false, true
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, true // the process is gone
	case err != nil:
		return false, false
	}
	for _, fd := range fds {
		l, err := os.Readlink(filepath.Join(dir, fd.Name()))
		if err != nil {
			continue
		}
		if in, ok := strings.CutPrefix(l, "socket:["); ok && inodes[strings.TrimSuffix(in, "]")] {
			return true, true
		}
	}
	return false, true
}
