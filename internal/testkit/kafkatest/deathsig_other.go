//go:build !linux

package kafkatest

import "os/exec"

// DieWithParent is a no-op where the kernel has no parent-death signal.
func DieWithParent(*exec.Cmd) {}
