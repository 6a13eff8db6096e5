package natscluster

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the server if the test process dies
// first (a test binary killed by its timeout leaves no server behind).
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
