package modules

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Exit is how a module's process ended.
type Exit struct {
	At     time.Time `json:"at"`
	Code   int       `json:"code"`             // -1 when killed by a signal or never started
	Signal string    `json:"signal,omitempty"` // the signal that killed it
	Reason string    `json:"reason"`           // in words: "exited with status 1", "stopped", "start failed: ..."
}

// proc is one run of a module's program. Its waiter goroutine reaps it,
// kills what is left of its process group, and closes exited.
type proc struct {
	cmd     *exec.Cmd
	pid     int
	started time.Time
	exited  chan struct{} // closed once exit is set
	exit    Exit
	// stopping is set when the node stopped it on purpose (the exit is
	// then "stopped", whatever the status).
	mu       sync.Mutex
	stopping bool
}

// startProc starts cmd through sp, tells g of its process group, with its output read line by line into
// out (stream name, line). The output goes through pipes of our own, not
// exec's copying, so that the process's exit is seen at once even when a
// child of it still holds the pipes.
func startProc(sp *spawner, g *guard, cmd *exec.Cmd, out func(stream, line string)) (*proc, error) {
	type pipe struct {
		name string
		r, w *os.File
	}
	var pipes []pipe
	closeAll := func() {
		for _, p := range pipes {
			p.r.Close()
			p.w.Close()
		}
	}
	for _, name := range []string{"stdout", "stderr"} {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("output pipe: %w", err)
		}
		pipes = append(pipes, pipe{name, r, w})
	}
	cmd.Stdout, cmd.Stderr = pipes[0].w, pipes[1].w
	if err := sp.start(cmd); err != nil {
		closeAll()
		return nil, err
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, started: time.Now(), exited: make(chan struct{})}
	g.add(p.pid) // its process group's id is its pid
	var readers sync.WaitGroup
	for _, pp := range pipes {
		pp.w.Close() // the child has its copy
		readers.Add(1)
		go func() { // exits at EOF: when the module and its children closed their output, or reap closes the pipe
			defer readers.Done()
			readLines(pp.r, func(line string) { out(pp.name, line) })
		}()
	}
	go func() { // exits once the process is reaped and its output read or given up
		err := cmd.Wait()
		// What is left of the group (children the module did not stop)
		// goes with it, before the group's id can be reused.
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		g.remove(p.pid)
		done := make(chan struct{})
		go func() { // exits when both readers did; bounded by the pipes' closing below
			readers.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(time.Second):
			for _, pp := range pipes {
				pp.r.Close() // a reader blocked on a pipe still held elsewhere returns
			}
			<-done
		}
		for _, pp := range pipes {
			pp.r.Close()
		}
		p.exit = p.exitOf(err)
		close(p.exited)
	}()
	return p, nil
}

// exitOf describes how the process ended.
func (p *proc) exitOf(err error) Exit {
	e := Exit{At: time.Now().UTC(), Code: -1}
	p.mu.Lock()
	stopping := p.stopping
	p.mu.Unlock()
	var ee *exec.ExitError
	switch {
	case err == nil:
		e.Code = 0
		e.Reason = "exited with status 0"
	case errors.As(err, &ee):
		ws, _ := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			e.Signal = ws.Signal().String()
			e.Reason = "killed by signal " + unix(ws.Signal())
		} else {
			e.Code = ee.ExitCode()
			e.Reason = fmt.Sprintf("exited with status %d", e.Code)
		}
	default:
		e.Reason = "wait: " + err.Error()
	}
	if stopping {
		e.Reason = "stopped (" + e.Reason + ")"
	}
	return e
}

// unix names a signal the way operators write it.
func unix(s syscall.Signal) string {
	switch s {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGSEGV:
		return "SIGSEGV"
	case syscall.SIGABRT:
		return "SIGABRT"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return s.String()
}

// stop ends the process: SIGTERM to its process group, SIGKILL to the
// group after grace. It returns once the process is reaped.
func (p *proc) stop(grace time.Duration) {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	select {
	case <-p.exited:
		return
	default:
	}
	_ = syscall.Kill(-p.pid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		<-p.exited
	}
}
