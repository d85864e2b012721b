//go:build !unix

package freeport

import "os"

// claim is the cross-process claim of port p where there is no flock(2):
// none, so only this process's own set keeps a port from being handed out
// twice.
func claim(p int) (f *os.File, held bool) { return nil, false }
