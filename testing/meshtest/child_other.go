//go:build unix && !linux

package meshtest

import "syscall"

// childAttr starts a service process in its own process group, as acc.
// Without a parent-death signal, Main's cleanup is the only guard.
func childAttr(acc *account) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	if acc != nil {
		a.Credential = &syscall.Credential{Uid: acc.uid, Gid: acc.gid, Groups: []uint32{}}
	}
	return a
}

// processAttr returns no special attributes outside Linux.
func processAttr() *syscall.SysProcAttr { return nil }
