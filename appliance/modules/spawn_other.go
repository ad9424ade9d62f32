//go:build unix && !linux

package modules

import (
	"os/exec"
	"syscall"
)

// Outside Linux there is no parent-death signal: a module killed with its
// node's SIGKILL keeps running (a graceful stop still stops it).

func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}

type spawner struct{}

func newSpawner() *spawner                    { return &spawner{} }
func (sp *spawner) start(cmd *exec.Cmd) error { return cmd.Start() }
func (sp *spawner) close()                    {}
