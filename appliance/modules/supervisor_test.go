package modules

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/backoff"
	"github.com/meshbox/meshbox/testing/wait"
)

// writeModule writes a module folder with a manifest and, when script is
// not "", an executable run.sh.
func writeModule(t testing.TB, catalog, name, manifest, script string) {
	t.Helper()
	dir := filepath.Join(catalog, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ManifestFile), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if script != "" {
		if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\n"+script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// newSupervisor starts a supervisor with sub-second backoffs, closed in
// cleanup.
func newSupervisor(t testing.TB, catalog string) *Supervisor {
	t.Helper()
	s, err := New(Config{
		Node:              "alpha",
		Catalog:           catalog,
		RunDir:            t.TempDir(),
		NATSURL:           "nats://127.0.0.1:4222",
		Restart:           backoff.Policy{Min: 20 * time.Millisecond, Max: 100 * time.Millisecond},
		CrashLoopRestarts: 4,
		CrashLoopWindow:   5 * time.Second,
		CrashLoopRetry:    time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// waitModule polls the module's status until ok holds or 5s pass.
func waitModule(t testing.TB, s *Supervisor, name, what string, ok func(Status) bool) Status {
	t.Helper()
	var found Status
	// 15 s: a module's first output can take seconds on a machine busy
	// building and running other tests (a shell's echo was not logged
	// within 5 s once).
	wait.Eventually(t, 15*time.Second, "module "+name+": "+what, func() error {
		all := s.Status()
		for _, st := range all {
			if st.Module == name && ok(st) {
				found = st
				return nil
			}
		}
		return fmt.Errorf("status %+v", all)
	})
	return found
}

func running(st Status) bool { return st.State == StateRunning && st.Pid > 0 }

const sleeper = `{"name": "%s", "selections": {"stable": {"command": "./run.sh"}}, "stop_grace": "2s"}`

func manifestFor(name string) string { return strings.Replace(sleeper, "%s", name, 1) }

func bindings(as ...cache.Assignment) cache.Bindings {
	return cache.Bindings{Node: "alpha", Assignments: as}
}

func apply(s *Supervisor, b cache.Bindings) { s.Apply(s.Prepare(b)) }

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func TestAutostartStopAndManualControl(t *testing.T) {
	cat := t.TempDir()
	writeModule(t, cat, "a", manifestFor("a"), "exec sleep 60\n")
	writeModule(t, cat, "b", manifestFor("b"), "exec sleep 60\n")
	s := newSupervisor(t, cat)
	apply(s, bindings(cache.Assignment{Module: "a", Selection: "stable", Autostart: true},
		cache.Assignment{Module: "b", Selection: "stable"}))
	st := waitModule(t, s, "a", "running", running)
	pid := st.Pid
	if b := waitModule(t, s, "b", "stopped", func(st Status) bool { return st.State == StateStopped }); b.Pid != 0 {
		t.Errorf("b without autostart: got pid %d, want none", b.Pid)
	}
	if err := s.Start("b"); err != nil {
		t.Fatal(err)
	}
	waitModule(t, s, "b", "running by hand", running)
	if err := s.Stop("a"); err != nil {
		t.Fatal(err)
	}
	st = waitModule(t, s, "a", "stopped by hand", func(st Status) bool { return st.State == StateStopped })
	if st.Manual != "stopped" || alive(pid) {
		t.Errorf("after Stop: manual %q, process alive %v; want stopped, gone", st.Manual, alive(pid))
	}
	if st.LastExit == nil || !strings.Contains(st.LastExit.Reason, "stopped") {
		t.Errorf("last exit: got %+v, want stopped", st.LastExit)
	}
	// Unassigned: stopped and gone from the status.
	st = waitModule(t, s, "b", "running", running)
	apply(s, bindings(cache.Assignment{Module: "a", Selection: "stable", Autostart: true}))
	wait.For(t, 3*time.Second, fmt.Sprintf("unassigned module b (pid %d) gone", st.Pid), func() bool { return !alive(st.Pid) })
	if err := s.Start("b"); !errors.Is(err, ErrUnknownModule) {
		t.Errorf("Start of an unassigned module: got %v, want ErrUnknownModule", err)
	}
}

func TestRestartWithBackoffThenCrashLooping(t *testing.T) {
	cat := t.TempDir()
	writeModule(t, cat, "flaky", manifestFor("flaky"), "echo started; exit 3\n")
	s := newSupervisor(t, cat)
	apply(s, bindings(cache.Assignment{Module: "flaky", Selection: "stable", Autostart: true}))
	st := waitModule(t, s, "flaky", "crash-looping", func(st Status) bool { return st.State == StateCrashLooping })
	if st.Restarts != 4 || st.LastExit == nil || st.LastExit.Code != 3 {
		t.Errorf("got restarts %d, last exit %+v; want 4 restarts, status 3", st.Restarts, st.LastExit)
	}
	lines, _ := s.Logs("flaky", 0)
	if len(lines) != 4 || lines[0].Text != "started" {
		t.Fatalf("logs: got %+v, want 4 lines \"started\"", lines)
	}
	// Each restart waited at least the lower half of its doubling pause.
	for i := 1; i < len(lines); i++ {
		gap := lines[i].At.Sub(lines[i-1].At)
		if least := s.cfg.Restart.Base(i) / 2; gap < least {
			t.Errorf("restart %d came %v after the run before, want at least %v", i, gap, least)
		}
	}
}

// Once crash-looping, a module is tried again only at the slow pace: a
// retry that fails goes straight back to crash-looping, without a new
// round of quick restarts.
func TestCrashLoopingRetriesSlowly(t *testing.T) {
	cat := t.TempDir()
	writeModule(t, cat, "flaky", manifestFor("flaky"), "exit 3\n")
	s := newSupervisor(t, cat)
	s.cfg.CrashLoopRetry = 300 * time.Millisecond
	apply(s, bindings(cache.Assignment{Module: "flaky", Selection: "stable", Autostart: true}))
	waitModule(t, s, "flaky", "crash-looping", func(st Status) bool { return st.State == StateCrashLooping && st.Restarts == 4 })
	st := waitModule(t, s, "flaky", "a slow retry", func(st Status) bool { return st.Restarts == 5 })
	if st.State != StateCrashLooping || st.Error != "failed 5 times in a row; last: exited with status 3" {
		t.Errorf("after a failed slow retry: got %s %q, want crash-looping again", st.State, st.Error)
	}
	// A manual start gives it a fresh round of quick restarts: four more
	// failures before it is crash-looping again.
	if err := s.Start("flaky"); err != nil {
		t.Fatal(err)
	}
	waitModule(t, s, "flaky", "a fresh round of restarts", func(st Status) bool { return st.Restarts == 9 && st.State == StateCrashLooping })
}

func TestOverridesAndGrantsReachTheModule(t *testing.T) {
	cat := t.TempDir()
	manifest := `{"name": "m", "selections": {"stable": {"command": "./run.sh", "env": {"COLOR": "blue", "LEVEL": "info"}}},
		"overrides": {"color": "COLOR"}, "grants": [{"resource": "nas/storage"}]}`
	writeModule(t, cat, "m", manifest, "env > \"$MESHBOX_RUNTIME_DIR/env.txt\"; exec sleep 60\n")
	s := newSupervisor(t, cat)
	b := bindings(cache.Assignment{Module: "m", Selection: "stable", Autostart: true})
	b.Overrides = []cache.Override{{Module: "m", Key: "color", Value: "red"}, {Module: "m", Key: "max.size", Value: "10"}}
	b.Grants = []cache.Grant{{Consumer: "alpha", Resource: "nas/storage", Provider: "nas", Credential: "s3cret"},
		{Consumer: "alpha", Resource: "other", Provider: "x", Credential: "not-for-m"}}
	apply(s, b)
	waitModule(t, s, "m", "running", running)
	env := readEnvFile(t, filepath.Join(s.cfg.RunDir, "m", "env.txt"))
	for k, want := range map[string]string{"COLOR": "red", "LEVEL": "info", "MESHBOX_OVERRIDE_MAX_SIZE": "10",
		"MESHBOX_MODULE": "m", "MESHBOX_NODE": "alpha", "NATS_URL": "nats://127.0.0.1:4222"} {
		if env[k] != want {
			t.Errorf("env %s: got %q, want %q", k, env[k], want)
		}
	}
	gf := env["MESHBOX_GRANT_NAS_STORAGE"]
	if gf == "" {
		t.Fatalf("no MESHBOX_GRANT_NAS_STORAGE in %v", env)
	}
	data, err := os.ReadFile(gf)
	if err != nil || string(data) != "s3cret" {
		t.Fatalf("grant file: %q, %v", data, err)
	}
	for path, want := range map[string]os.FileMode{gf: 0o600, filepath.Dir(gf): 0o700, filepath.Join(s.cfg.RunDir, "m"): 0o700} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v), want %v", path, fi.Mode().Perm(), err, want)
		}
	}
	for k, v := range env {
		if strings.Contains(v, "s3cret") || strings.Contains(v, "not-for-m") {
			t.Errorf("a credential is in the environment: %s", k)
		}
	}
	// A changed override restarts the module with the new value.
	before := waitModule(t, s, "m", "running", running).Pid
	b.Overrides[0].Value = "green"
	apply(s, b)
	after := waitModule(t, s, "m", "restarted", func(st Status) bool { return running(st) && st.Pid != before })
	_ = after
	wait.For(t, 3*time.Second, "the restarted module gets COLOR=green", func() bool {
		return readEnvFile(t, filepath.Join(s.cfg.RunDir, "m", "env.txt"))["COLOR"] == "green"
	})
}

func readEnvFile(t testing.TB, path string) map[string]string {
	t.Helper()
	var data []byte
	wait.Eventually(t, 3*time.Second, "the module writes "+path, func() error {
		var err error
		if data, err = os.ReadFile(path); err == nil && len(data) == 0 {
			err = errors.New("empty")
		}
		return err
	})
	env := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		env[k] = v
	}
	return env
}

func TestModulesThatCannotRun(t *testing.T) {
	cat := t.TempDir()
	writeModule(t, cat, "good", manifestFor("good"), "exec sleep 60\n")
	writeModule(t, cat, "nocmd", `{"name": "nocmd", "selections": {"stable": {}}}`, "")
	writeModule(t, cat, "missing", `{"name": "missing", "selections": {"stable": {"command": "./nope"}}}`, "")
	writeModule(t, cat, "typo", `{"name": "typo", "selections": {"stable": {"command": "./run.sh"}}, "stop_grase": "1s"}`, "exit 0\n")
	s := newSupervisor(t, cat)
	var as []cache.Assignment
	for _, m := range []string{"good", "nocmd", "missing", "typo", "absent"} {
		as = append(as, cache.Assignment{Module: m, Selection: "stable", Autostart: true})
	}
	as = append(as, cache.Assignment{Module: "good2", Selection: "stable"})
	apply(s, bindings(as...))
	waitModule(t, s, "good", "running", running)
	for name, want := range map[string]struct{ state, err string }{
		"nocmd":   {StateFailed, "nocmd/manifest.json: selections.stable.command: required"},
		"missing": {StateFailed, "missing/manifest.json: selections.stable.command: "},
		"typo":    {StateFailed, "typo/manifest.json: stop_grase: unknown field"},
		"absent":  {StateNotInCatalog, "module absent is not in the catalog"},
	} {
		st := waitModule(t, s, name, want.state, func(st Status) bool { return st.State == want.state })
		if !strings.Contains(st.Error, want.err) {
			t.Errorf("%s: error %q, want it to contain %q", name, st.Error, want.err)
		}
	}
	apply(s, bindings(cache.Assignment{Module: "good", Selection: "nightly", Autostart: true}))
	st := waitModule(t, s, "good", "failed", func(st Status) bool { return st.State == StateFailed })
	if want := `selection "nightly" is not in the manifest of module good (it has stable)`; st.Error != want {
		t.Errorf("unknown selection: got %q, want %q", st.Error, want)
	}
}

func TestManifestErrorsNameFileAndField(t *testing.T) {
	for _, tc := range []struct{ manifest, field string }{
		{`{"selections": {"s": {"command": "x"}}}`, "name"},
		{`{"name": "other", "selections": {"s": {"command": "x"}}}`, "name"},
		{`{"name": "m"}`, "selections"},
		{`{"name": "m", "selections": {"s": {"command": "x", "env": {"A-B": "1"}}}}`, "selections.s.env"},
		{`{"name": "m", "selections": {"s": {"command": "x", "dir": "../up"}}}`, "selections.s.dir"},
		{`{"name": "m", "selections": {"s": {"command": "x"}}, "stop_grace": 5}`, "stop_grace"},
		{`{"name": "m", "selections": {"s": {"command": "x"}}, "stop_grace": "5"}`, "stop_grace"},
		{`{"name": "m", "selections": {"s": {"command": "x"}}, "hosts": {"stages": ["bad stage"]}}`, "hosts.stages[0]"},
		{`{"name": "m", "selections": {"s": {"command": "x"}}, "grants": [{"resource": ""}]}`, "grants[0].resource"},
		{`{"name": "m", "selections": {"s": {"command": "x"}}, "extra": 1}`, "extra"},
	} {
		dir := t.TempDir()
		path := filepath.Join(dir, ManifestFile)
		if err := os.WriteFile(path, []byte(tc.manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := ReadManifest(path, "m")
		var me *ManifestError
		if !errors.As(err, &me) || me.File != path || me.Field != tc.field || !errors.Is(err, ErrManifest) {
			t.Errorf("%s: got %v, want a ManifestError for field %q", tc.manifest, err, tc.field)
		}
	}
}

// A module that names another user runs as that user when the node may
// switch users (root), with its runtime directory and grant files its own;
// a node that may not switch refuses it with a named error.
func TestModuleRunsAsItsUser(t *testing.T) {
	cat := t.TempDir()
	writeModule(t, cat, "m", `{"name": "m", "selections": {"stable": {"command": "./run.sh"}}, "user": "nobody",
		"grants": [{"resource": "disk"}], "stop_grace": "2s"}`,
		"id -u > \"$MESHBOX_RUNTIME_DIR/uid\"; mkdir -m 700 \"$MESHBOX_RUNTIME_DIR/own\"; touch \"$MESHBOX_RUNTIME_DIR/own/f\"; exec sleep 60\n")
	s := newSupervisor(t, cat)
	// The module's user must reach its program and its runtime directory.
	for _, d := range []string{cat, filepath.Dir(cat), s.cfg.RunDir, filepath.Dir(s.cfg.RunDir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b := bindings(cache.Assignment{Module: "m", Selection: "stable", Autostart: true})
	b.Grants = []cache.Grant{{Consumer: "alpha", Resource: "disk", Provider: "nas", Credential: "pw"}}
	apply(s, b)
	if os.Geteuid() != 0 {
		st := waitModule(t, s, "m", "failed", func(st Status) bool { return st.State == StateFailed })
		if !strings.Contains(st.Error, `module runs as user "nobody", but the node runs as`) || !strings.Contains(st.Error, "may not switch users") {
			t.Errorf("got error %q, want the refusal to switch users", st.Error)
		}
		return
	}
	first := waitModule(t, s, "m", "running", running)
	dir := filepath.Join(s.cfg.RunDir, "m")
	uid := ""
	wait.Poll(3*time.Second, func() bool {
		data, _ := os.ReadFile(filepath.Join(dir, "uid"))
		uid = strings.TrimSpace(string(data))
		return uid != ""
	})
	if uid != "65534" {
		t.Errorf("the module ran as uid %q, want 65534 (nobody)", uid)
	}
	for _, path := range []string{dir, filepath.Join(dir, "grants", GrantFile("disk", "nas"))} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65534 {
			t.Errorf("%s: owner uid %d, want 65534", path, st.Uid)
		}
	}
	// A new run gets its runtime directory afresh, whatever the last left.
	if err := s.Restart("m"); err != nil {
		t.Fatal(err)
	}
	st := waitModule(t, s, "m", "running again", func(st Status) bool { return running(st) && st.Pid != first.Pid })
	if st.Error != "" {
		t.Errorf("restart: error %q", st.Error)
	}
	// Stopped, its runtime directory and grant files are gone.
	if err := s.Stop("m"); err != nil {
		t.Fatal(err)
	}
	waitModule(t, s, "m", "stopped", func(st Status) bool { return st.State == StateStopped })
	wait.For(t, 3*time.Second, "the runtime directory of a stopped module gone", func() bool {
		_, err := os.Stat(dir)
		return errors.Is(err, os.ErrNotExist)
	})
}

// Stopping a module sends SIGTERM to its whole process group, and SIGKILL
// after its stop grace to one that does not end. "polite" ends only once
// its child ended, which only the group's SIGTERM ends (a SIGTERM to the
// module's process alone would leave it waiting out the grace); "stubborn"
// ignores SIGTERM, it and its child, and is killed once its grace passed.
func TestStopTermsTheGroupThenKills(t *testing.T) {
	cat := t.TempDir()
	writeModule(t, cat, "polite", `{"name": "polite", "selections": {"stable": {"command": "./run.sh"}}, "stop_grace": "5s"}`,
		// "up" once the child runs sleep: a SIGTERM between its fork and
		// its exec would be taken by the shell's trap it still carries,
		// and sleep would run on.
		"trap 'wait; echo child ended; exit 0' TERM\nsleep 600 &\nc=$!\nuntil [ \"$(cat /proc/$c/comm 2>/dev/null)\" = sleep ]; do :; done\necho up\nwait\n")
	writeModule(t, cat, "stubborn", `{"name": "stubborn", "selections": {"stable": {"command": "./run.sh"}}, "stop_grace": "300ms"}`,
		"trap '' TERM\nsleep 600 &\necho up\nwait\n")
	s := newSupervisor(t, cat)
	apply(s, bindings(cache.Assignment{Module: "polite", Selection: "stable", Autostart: true},
		cache.Assignment{Module: "stubborn", Selection: "stable", Autostart: true}))
	for _, name := range []string{"polite", "stubborn"} {
		waitModule(t, s, name, "up", func(st Status) bool {
			lines, _ := s.Logs(name, 0)
			return running(st) && len(lines) == 1 && lines[0].Text == "up"
		})
	}
	for _, c := range []struct {
		name, reason string
		least, most  time.Duration
	}{
		{"polite", "stopped (exited with status 0)", 0, 2 * time.Second},
		{"stubborn", "stopped (killed by signal SIGKILL)", 300 * time.Millisecond, 3 * time.Second},
	} {
		start := time.Now()
		if err := s.Stop(c.name); err != nil {
			t.Fatal(err)
		}
		st := waitModule(t, s, c.name, "stopped", func(st Status) bool { return st.State == StateStopped })
		took := time.Since(start)
		if st.LastExit == nil || st.LastExit.Reason != c.reason {
			t.Errorf("%s: last exit %+v, want %q", c.name, st.LastExit, c.reason)
		}
		if took < c.least || took > c.most {
			t.Errorf("%s: stopped after %v, want between %v and %v", c.name, took, c.least, c.most)
		}
	}
	if lines, _ := s.Logs("polite", 0); len(lines) != 2 || lines[1].Text != "child ended" {
		t.Errorf("polite's output: got %+v, want up, child ended", lines)
	}
}

// An assignment changed to another selection restarts the module at that
// selection; one changed to no autostart stops it.
func TestChangedAssignmentRestartsOrStops(t *testing.T) {
	cat := t.TempDir()
	writeModule(t, cat, "m", `{"name": "m", "selections": {"stable": {"command": "./run.sh", "env": {"SEL": "s"}},
		"nightly": {"command": "./run.sh", "env": {"SEL": "n"}}}, "stop_grace": "2s"}`,
		"echo \"$SEL $MESHBOX_SELECTION\"\nexec sleep 60\n")
	s := newSupervisor(t, cat)
	apply(s, bindings(cache.Assignment{Module: "m", Selection: "stable", Autostart: true}))
	// Running, and past its echo: a run stopped before its shell got to
	// it (a busy machine) prints nothing.
	first := waitModule(t, s, "m", "running and printed its selection", func(st Status) bool {
		lines, _ := s.Logs("m", 0)
		return running(st) && len(lines) == 1
	})
	apply(s, bindings(cache.Assignment{Module: "m", Selection: "nightly", Autostart: true}))
	second := waitModule(t, s, "m", "running at nightly", func(st Status) bool {
		lines, _ := s.Logs("m", 0)
		return running(st) && st.Pid != first.Pid && st.Selection == "nightly" && len(lines) == 2
	})
	if lines, _ := s.Logs("m", 0); lines[0].Text != "s stable" || lines[1].Text != "n nightly" {
		t.Errorf("output of the two runs: got %+v, want \"s stable\" then \"n nightly\"", lines)
	}
	if alive(first.Pid) {
		t.Errorf("the run at stable (pid %d) still runs", first.Pid)
	}
	apply(s, bindings(cache.Assignment{Module: "m", Selection: "nightly"}))
	st := waitModule(t, s, "m", "stopped", func(st Status) bool { return st.State == StateStopped })
	if st.Pid != 0 || alive(second.Pid) || st.Autostart {
		t.Errorf("without autostart: got %+v, process alive %v; want it stopped", st, alive(second.Pid))
	}
}
