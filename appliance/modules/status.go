package modules

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/meshbox/meshbox/internal/wire"
)

// Status is one assigned module as the node's status, `meshbox modules`
// and the metrics show it. It holds no environment, argument or grant.
type Status struct {
	Module    string `json:"module"`
	Selection string `json:"selection"`
	Autostart bool   `json:"autostart"`
	State     string `json:"state"`
	// Manual is "started" or "stopped" when an operator started or stopped
	// the module by hand since its assignment last changed.
	Manual        string     `json:"manual,omitempty"`
	Pid           int        `json:"pid,omitempty"`
	StartedAt     *time.Time `json:"started_at,omitempty"`
	UptimeSeconds float64    `json:"uptime_seconds"`
	Restarts      int        `json:"restarts"`
	LastExit      *Exit      `json:"last_exit,omitempty"`
	// NextStart is when a module waiting after a failure is tried again.
	NextStart *time.Time `json:"next_start,omitempty"`
	// Error is why the module cannot run or is not running well.
	Error string `json:"error,omitempty"`
	// Warnings name what the module declares and does not serve after its
	// start grace.
	Warnings []string `json:"warnings,omitempty"`
}

// Status returns every assigned module, sorted by name.
func (s *Supervisor) Status() []Status {
	s.mu.Lock()
	runners := make([]*runner, 0, len(s.runners))
	for _, r := range s.runners {
		runners = append(runners, r)
	}
	hosted := s.hosted
	s.mu.Unlock()
	now := time.Now()
	out := make([]Status, 0, len(runners))
	for _, r := range runners {
		out = append(out, r.status(now, hosted))
	}
	slices.SortFunc(out, func(a, b Status) int { return cmp.Compare(a.Module, b.Module) })
	return out
}

func (r *runner) status(now time.Time, hosted map[string]bool) Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := Status{
		Module:    r.name,
		Selection: r.spec.assignment.Selection,
		Autostart: r.spec.assignment.Autostart,
		State:     r.state,
		Manual:    r.manual,
		Restarts:  r.restarts,
		Error:     r.err,
	}
	if r.lastExit != nil {
		ex := *r.lastExit
		st.LastExit = &ex
	}
	if !r.nextStart.IsZero() && r.state != StateRunning {
		t := r.nextStart.UTC()
		st.NextStart = &t
	}
	if r.state == StateRunning || r.state == StateStopping {
		t := r.startedAt.UTC()
		st.Pid, st.StartedAt, st.UptimeSeconds = r.pid, &t, now.Sub(r.startedAt).Seconds()
	}
	if m := r.spec.entry.Manifest; m != nil && r.state == StateRunning && now.Sub(r.startedAt) >= m.startGrace() {
		for _, c := range m.Hosts.Capabilities {
			if !hosted[wire.CapSubject(c)] {
				st.Warnings = append(st.Warnings, fmt.Sprintf("module %s declares capability `%s` but does not serve it", r.name, c))
			}
		}
		for _, s := range m.Hosts.Stages {
			if !hosted[wire.WorkSubject(s)] {
				st.Warnings = append(st.Warnings, fmt.Sprintf("module %s declares stage `%s` but does not serve it", r.name, s))
			}
		}
	}
	return st
}
