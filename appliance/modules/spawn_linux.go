//go:build linux

package modules

import (
	"os/exec"
	"runtime"
	"syscall"
)

// On Linux a module dies with the node: its SysProcAttr asks the kernel for
// SIGKILL when its parent dies (Pdeathsig). The kernel means the parent
// *thread*: a child started from a thread that later exits gets the signal
// then, while the node lives on. Go's scheduler may end an OS thread when
// a goroutine locked to it returns, and starts children from whichever
// thread runs the calling goroutine. So every module is started from one
// goroutine locked to its thread for the supervisor's whole life (the
// spawner); that thread ends only after every module stopped.

// sysProcAttr puts the module in a process group of its own (so that a
// stop reaches its children and a terminal's signals do not) and has it
// killed when the node dies; cred switches the user (nil: the node's).
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
}

// spawner starts every module from one locked OS thread.
type spawner struct {
	reqs chan spawnReq
	done chan struct{}
}

type spawnReq struct {
	cmd   *exec.Cmd
	reply chan error
}

func newSpawner() *spawner {
	sp := &spawner{reqs: make(chan spawnReq), done: make(chan struct{})}
	go sp.run() // exits when close closes reqs, after every module stopped
	return sp
}

// run starts the commands it is sent, on its own locked thread. It never
// unlocks: when it returns the runtime ends the thread, and a module that
// somehow outlived the supervisor gets its SIGKILL then.
func (sp *spawner) run() {
	runtime.LockOSThread()
	defer close(sp.done)
	for r := range sp.reqs {
		r.reply <- r.cmd.Start()
	}
}

// start starts cmd from the spawner's thread.
func (sp *spawner) start(cmd *exec.Cmd) error {
	reply := make(chan error, 1)
	sp.reqs <- spawnReq{cmd: cmd, reply: reply}
	return <-reply
}

// close ends the spawner once no module runs.
func (sp *spawner) close() {
	close(sp.reqs)
	<-sp.done
}
