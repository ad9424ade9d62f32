package meshtest

import "syscall"

// childAttr starts a service process in its own process group, as acc, and
// has the kernel kill it when the test process dies.
func childAttr(acc *account) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if acc != nil {
		a.Credential = &syscall.Credential{Uid: acc.uid, Gid: acc.gid, Groups: []uint32{}}
	}
	return a
}

// processAttr has the kernel kill a meshbox child when the test process dies.
func processAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
