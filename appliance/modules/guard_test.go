package modules

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startGroup starts a shell with a child of its own, in a process group of
// its own, and returns the group's id.
func startGroup(t *testing.T) (*exec.Cmd, int) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "sleep 600 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	return cmd, cmd.Process.Pid
}

func TestGuardKillsTheGroupsItStillKnowsAtAnEndWithoutGoodbye(t *testing.T) {
	_, keptGroup := startGroup(t)
	gone, goneGroup := startGroup(t)
	in := fmt.Sprintf("+%d\n+%d\n-%d\n+1\n+x\n", goneGroup, keptGroup, keptGroup)
	if n := RunGuard(strings.NewReader(in)); n != 1 {
		t.Errorf("killed %d groups, want 1", n)
	}
	done := make(chan error, 1)
	go func() { done <- gone.Wait() }() // exits when the shell is reaped
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the group the guard still knew was not killed")
	}
	if err := syscall.Kill(-keptGroup, 0); err != nil {
		t.Errorf("the group told gone was killed: %v", err)
	}
}

func TestGuardKillsNothingAfterGoodbye(t *testing.T) {
	_, group := startGroup(t)
	if n := RunGuard(strings.NewReader(fmt.Sprintf("+%d\nbye\n", group))); n != 0 {
		t.Errorf("killed %d groups after bye, want 0", n)
	}
	if err := syscall.Kill(-group, 0); err != nil {
		t.Errorf("the group was killed after bye: %v", err)
	}
}
