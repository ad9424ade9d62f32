package modules

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// ctl is a manual command for one module.
type ctl int

const (
	ctlStart ctl = iota + 1
	ctlStop
	ctlRestart
)

// runner keeps one assigned module in the state its spec and the manual
// commands ask for. Its loop goroutine alone starts and stops the module's
// process; everything else talks to it by changing the fields under mu
// and kicking it.
type runner struct {
	s    *Supervisor
	name string
	logs *logRing
	kick chan struct{} // buffered(1): the wanted state changed
	quit chan struct{} // closed by end: stop the process and exit
	once sync.Once

	mu       sync.Mutex // guards the fields below
	spec     spec
	want     bool   // the module should run
	manual   string // "started" or "stopped" by hand since the last change, or ""
	gen      uint64 // bumped by a change of spec and by Restart: a running process of an older gen is restarted
	startNow bool   // Start or Restart: skip a pending backoff

	// Written by loop, read by status.
	state     string
	err       string
	pid       int
	startedAt time.Time
	restarts  int
	lastExit  *Exit
	nextStart time.Time
}

func newRunner(s *Supervisor, name string, sp spec) *runner {
	return &runner{
		s: s, name: name, logs: newLogRing(s.cfg.LogLines),
		kick: make(chan struct{}, 1), quit: make(chan struct{}),
		spec: sp, want: sp.assignment.Autostart, state: StateStopped,
	}
}

func (r *runner) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// end makes the loop stop the process and exit.
func (r *runner) end() { r.once.Do(func() { close(r.quit) }) }

// update takes a new spec; it reports whether it differs from the one in
// force (then manual starts and stops are forgotten and the module runs
// as its assignment says).
func (r *runner) update(sp spec) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sp.hash == r.spec.hash {
		return false
	}
	r.spec = sp
	r.want = sp.assignment.Autostart
	r.manual = ""
	r.gen++
	r.startNow = true
	r.poke()
	return true
}

// control applies a manual command.
func (r *runner) control(c ctl) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c != ctlStop && r.spec.err != nil {
		return fmt.Errorf("%w: %w", ErrNotRunnable, r.spec.err)
	}
	switch c {
	case ctlStart:
		r.want, r.manual, r.startNow = true, "started", true
	case ctlStop:
		r.want, r.manual = false, "stopped"
	case ctlRestart:
		r.want, r.manual, r.startNow = true, "started", true
		r.gen++
	}
	r.poke()
	return nil
}

func (r *runner) setState(state, err string) {
	r.mu.Lock()
	r.state, r.err = state, err
	if state != StateRunning && state != StateStopping {
		r.pid = 0
	}
	r.mu.Unlock()
}

// loop runs the module until end. See the package comment for the restart
// rules.
func (r *runner) loop() {
	cfg := r.s.cfg
	var (
		failures    []time.Time // failed runs within the crash-loop window
		consecutive int         // failed runs in a row
		looping     bool        // crash-looping: a failed retry goes straight back to the slow pace
		retry       *time.Timer
		retryC      <-chan time.Time
	)
	stopRetry := func() {
		if retry != nil {
			retry.Stop()
			retry, retryC = nil, nil
		}
	}
	defer stopRetry()
	schedule := func(state, errText string, d time.Duration) {
		stopRetry()
		retry = time.NewTimer(d)
		retryC = retry.C
		r.mu.Lock()
		r.state, r.err, r.pid = state, errText, 0
		r.nextStart = time.Now().Add(d)
		r.mu.Unlock()
	}
	for {
		r.mu.Lock()
		sp, want, gen, now := r.spec, r.want, r.gen, r.startNow
		r.startNow = false
		r.mu.Unlock()
		if now {
			stopRetry()
			failures, consecutive, looping = nil, 0, false
		}
		switch {
		case sp.err != nil:
			stopRetry()
			r.setState(sp.state, sp.err.Error())
		case !want:
			stopRetry()
			failures, consecutive, looping = nil, 0, false
			r.setState(StateStopped, "")
			r.removeRuntimeDir() // its grant files do not outlive the run
		case retryC != nil:
			// Waiting to restart; the state says why.
		default:
			p, err := r.launch(sp)
			if err != nil {
				r.s.log.Error("module did not start", "module", r.name, "err", err)
				r.mu.Lock()
				r.lastExit = &Exit{At: time.Now().UTC(), Code: -1, Reason: "start failed: " + err.Error()}
				r.mu.Unlock()
				// A missing program or user does not come back by itself
				// soon: tried again slowly (and at once on a change or a
				// manual start).
				schedule(StateFailed, err.Error(), cfg.CrashLoopRetry)
				continue
			}
			ex, ended := r.supervise(p, sp, gen)
			if ended {
				r.removeRuntimeDir()
				return
			}
			if ex == nil {
				continue // stopped on purpose; the loop looks what is wanted now
			}
			t := time.Now()
			if ex.At.Sub(p.started) >= cfg.CrashLoopWindow {
				failures, consecutive, looping = nil, 0, false // it ran well for a while
			}
			consecutive++
			kept := failures[:0]
			for _, f := range failures {
				if t.Sub(f) < cfg.CrashLoopWindow {
					kept = append(kept, f)
				}
			}
			failures = append(kept, t)
			r.mu.Lock()
			r.restarts++
			r.mu.Unlock()
			if looping || len(failures) >= cfg.CrashLoopRestarts {
				looping = true
				r.s.log.Error("module is crash-looping; trying again later", "module", r.name,
					"failures", consecutive, "retry_in", cfg.CrashLoopRetry, "last_exit", ex.Reason)
				schedule(StateCrashLooping, fmt.Sprintf("failed %d times in a row; last: %s", consecutive, ex.Reason), cfg.CrashLoopRetry)
				continue
			}
			d := cfg.Restart.Delay(consecutive)
			r.s.log.Warn("module exited; restarting", "module", r.name, "reason", ex.Reason, "in", d.Round(time.Millisecond))
			schedule(StateStarting, "", d)
			continue
		}
		select {
		case <-r.quit:
			r.setState(StateStopped, "")
			r.removeRuntimeDir()
			return
		case <-r.kick:
		case <-retryC:
			stopRetry()
		}
	}
}

// supervise waits for the process to exit, for a change that stops it,
// or for the end. It returns the exit of a run that ended by itself while
// wanted (nil when the node stopped it), and whether the runner ends.
func (r *runner) supervise(p *proc, sp spec, gen uint64) (*Exit, bool) {
	stopGrace := sp.entry.Manifest.stopGrace()
	stop := func() {
		r.setState(StateStopping, "")
		p.stop(stopGrace)
		r.recordExit(p)
		r.s.log.Info("module stopped", "module", r.name, "pid", p.pid, "exit", p.exit.Reason)
	}
	// Once the start grace has passed, say (once per run) what the module
	// declares and does not serve; the status keeps saying it.
	grace := time.NewTimer(sp.entry.Manifest.startGrace())
	defer grace.Stop()
	for {
		select {
		case <-grace.C:
			for _, w := range r.status(time.Now(), r.s.hostedNow()).Warnings {
				r.s.log.Warn(w, "module", r.name)
			}
		case <-p.exited:
			r.recordExit(p)
			r.mu.Lock()
			changed := r.gen != gen || !r.want
			r.mu.Unlock()
			if changed {
				return nil, false
			}
			return &p.exit, false
		case <-r.kick:
			r.mu.Lock()
			changed := r.gen != gen || !r.want || r.spec.err != nil
			r.mu.Unlock()
			if changed {
				stop()
				return nil, false
			}
		case <-r.quit:
			stop()
			r.setState(StateStopped, "")
			return nil, true
		}
	}
}

func (r *runner) recordExit(p *proc) {
	ex := p.exit
	r.mu.Lock()
	r.lastExit = &ex
	r.pid = 0
	r.mu.Unlock()
}

// launch prepares the runtime directory and the environment and starts
// the selection's program.
func (r *runner) launch(sp spec) (*proc, error) {
	cfg := r.s.cfg
	m := sp.entry.Manifest
	sel := m.Selections[sp.assignment.Selection]
	as, err := lookupUser(m.User)
	if err != nil {
		return nil, err
	}
	prog, err := sp.entry.resolveCommand(sp.assignment.Selection, cfg.Path)
	if err != nil {
		return nil, err
	}
	dir, grantEnv, err := prepareRuntimeDir(cfg.RunDir, r.name, as, m, sp.grants, cfg.OpenGrant)
	if err != nil {
		return nil, err
	}
	nodeEnv := map[string]string{
		EnvNode:      cfg.Node,
		EnvModule:    r.name,
		EnvSelection: sp.assignment.Selection,
		"NATS_URL":   cfg.NATSURL,
	}
	for k, v := range grantEnv {
		nodeEnv[k] = v
	}
	if cfg.Credentials != nil {
		cred, err := cfg.Credentials(r.name, m.Permissions())
		if err != nil {
			return nil, fmt.Errorf("local NATS credential: %w", err)
		}
		if len(cred.File) > 0 {
			path := filepath.Join(dir, NATSKeyFile)
			if err := writeSecret(path, string(cred.File), as); err != nil {
				return nil, fmt.Errorf("local NATS credential: %w", err)
			}
			nodeEnv["NATS_NKEY"] = path
			nodeEnv["NATS_INBOX_PREFIX"] = cred.InboxPrefix
		}
	}
	base := map[string]string{"PATH": cfg.Path}
	for k, v := range map[string]string{"HOME": as.home, "USER": as.name, "LOGNAME": as.name} {
		if v != "" {
			base[k] = v
		}
	}
	cmd := &exec.Cmd{
		Path:        prog,
		Args:        append([]string{prog}, sel.Args...),
		Dir:         sp.entry.workDir(sp.assignment.Selection),
		Env:         moduleEnv(base, sel.Env, nodeEnv, overrideEnv(m, sp.overrides)),
		SysProcAttr: sysProcAttr(as.cred),
	}
	p, err := startProc(r.s.sp, r.s.guard, cmd, r.output)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", prog, err)
	}
	r.mu.Lock()
	r.state, r.err, r.pid, r.startedAt, r.nextStart = StateRunning, "", p.pid, p.started, time.Time{}
	r.mu.Unlock()
	r.s.log.Info("module started", "module", r.name, "selection", sp.assignment.Selection, "pid", p.pid)
	return p, nil
}

// removeRuntimeDir removes the module's runtime directory, grant files
// included, once no run of it is left.
func (r *runner) removeRuntimeDir() {
	dir := filepath.Join(r.s.cfg.RunDir, r.name)
	if os.Geteuid() == 0 {
		reclaim(dir)
	}
	if err := os.RemoveAll(dir); err != nil {
		r.s.log.Error("cannot remove the runtime directory of a stopped module", "module", r.name, "err", err)
	}
}

// output takes one line the module wrote.
func (r *runner) output(stream, line string) {
	l := r.logs.add(stream, line)
	r.s.log.Info("module output", "module", r.name, "stream", stream, "line", line)
	if f := r.s.cfg.OnLine; f != nil {
		f(r.name, l)
	}
}
