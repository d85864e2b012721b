package kafkatest

import (
	"os/exec"
	"syscall"
)

// DieWithParent has the broker killed when the test process dies, even by
// SIGKILL or a test timeout, so that no JVM outlives its test run.
func DieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
