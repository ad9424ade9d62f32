package modules

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
)

// The guard makes "no module outlives its node" hold for a module's whole
// process group, not only its own process (which Pdeathsig covers): a
// shell script that runs a program without exec, a program that starts
// helpers. It is a small process of its own (meshbox module-guard, see
// RunGuard) that the node tells, on the guard's standard input, the
// process group of every module it starts ("+<pgid>") and of every module
// that ended ("-<pgid>"). When that input ends without a goodbye — the
// node died, whatever killed it; the kernel closes its pipes — the guard
// sends SIGKILL to every group it still knows, and exits. A node that
// stops normally stops its modules first and then closes the input: the
// guard finds nothing left to kill.
//
// A module that leaves its process group (setsid) leaves the guard's
// reach too.

// guard is the node's end of the guard process. Safe for concurrent use.
type guard struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	in   io.WriteCloser
	dead bool // a write failed: the guard is gone
}

// startGuard starts argv as the guard. It runs in a process group of its
// own, so that a terminal's Ctrl-C, meant for the node, does not end it.
func startGuard(argv []string) (*guard, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("module guard: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("module guard: %w", err)
	}
	return &guard{cmd: cmd, in: in}, nil
}

func (g *guard) send(op byte, pgid int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dead {
		return
	}
	if _, err := g.in.Write([]byte(string(op) + strconv.Itoa(pgid) + "\n")); err != nil {
		g.dead = true
	}
}

// add tells the guard a module's process group exists.
func (g *guard) add(pgid int) { g.send('+', pgid) }

// remove tells the guard a module's process group is gone.
func (g *guard) remove(pgid int) { g.send('-', pgid) }

// close says goodbye (every module has stopped) and waits for the guard.
func (g *guard) close() {
	if g == nil {
		return
	}
	g.mu.Lock()
	_, _ = g.in.Write([]byte("bye\n")) // a guard already gone has nothing to do
	_ = g.in.Close()
	g.dead = true
	g.mu.Unlock()
	_ = g.cmd.Wait()
}

// RunGuard is the guard process's work (meshbox module-guard): it reads
// "+<pgid>" and "-<pgid>" lines until "bye" or the end of in, and at an
// end without "bye" sends SIGKILL to every process group it was told of
// and not told gone. It reports how many groups it killed.
func RunGuard(in io.Reader) int {
	groups := map[int]bool{}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		line := sc.Text()
		if line == "bye" {
			return 0
		}
		if len(line) < 2 {
			continue
		}
		pgid, err := strconv.Atoi(line[1:])
		if err != nil || pgid <= 1 {
			continue // never a group that is not a module's
		}
		switch line[0] {
		case '+':
			groups[pgid] = true
		case '-':
			delete(groups, pgid)
		}
	}
	n := 0
	for pgid := range groups {
		if syscall.Kill(-pgid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}
