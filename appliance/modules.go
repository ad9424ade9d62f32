package appliance

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/meshbox/meshbox/appliance/modules"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/backoff"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
)

// ModulesConfig is the module supervision part of the configuration: where
// the catalog is, where runtime directories go, and how failing modules
// are restarted.
type ModulesConfig struct {
	// Dir is the module catalog: one folder per module with a
	// manifest.json. Default: /etc/meshbox/modules with the system data
	// directory /var/lib/meshbox, else "modules" in the data directory
	// (see Config.ModulesDir).
	Dir string `json:"dir"`
	// RunDir holds each module's private runtime directory (grant files).
	// Default: "run" in the data directory. A module that runs as another
	// user than the node's needs every directory above it to be
	// traversable (the installed unit uses /run/meshbox/modules).
	RunDir string `json:"run_dir"`
	// RestartMin and RestartMax bound the jittered, doubling pause before
	// a failed module is started again.
	RestartMin Duration `json:"restart_min"`
	RestartMax Duration `json:"restart_max"`
	// CrashLoopRestarts failures within CrashLoopWindow make a module
	// crash-looping; it is then tried again every CrashLoopRetry.
	CrashLoopRestarts int      `json:"crash_loop_restarts"`
	CrashLoopWindow   Duration `json:"crash_loop_window"`
	CrashLoopRetry    Duration `json:"crash_loop_retry"`
	// LogLines is how many lines of each module's output the node keeps
	// for `meshbox module logs`.
	LogLines int `json:"log_lines"`
}

func defaultModulesConfig() ModulesConfig {
	return ModulesConfig{
		RestartMin:        Duration(modules.DefaultRestartMin),
		RestartMax:        Duration(modules.DefaultRestartMax),
		CrashLoopRestarts: modules.DefaultCrashLoopRestarts,
		CrashLoopWindow:   Duration(modules.DefaultCrashLoopWindow),
		CrashLoopRetry:    Duration(modules.DefaultCrashLoopRetry),
		LogLines:          modules.DefaultLogLines,
	}
}

// validate reports each bad field through bad.
func (m ModulesConfig) validate(bad func(field, format string, args ...any)) {
	positive := map[string]Duration{
		"modules.restart_min":       m.RestartMin,
		"modules.restart_max":       m.RestartMax,
		"modules.crash_loop_window": m.CrashLoopWindow,
		"modules.crash_loop_retry":  m.CrashLoopRetry,
	}
	for _, f := range sortedKeys(positive) {
		if d := positive[f]; d <= 0 {
			bad(f, "must be a positive duration, got %s", d)
		}
	}
	if m.RestartMax < m.RestartMin {
		bad("modules.restart_max", "%s is below modules.restart_min %s", m.RestartMax, m.RestartMin)
	}
	if m.CrashLoopRestarts < 1 || m.CrashLoopRestarts > 1000 {
		bad("modules.crash_loop_restarts", "%d is out of range 1..1000", m.CrashLoopRestarts)
	}
	if m.LogLines < 1 || m.LogLines > 100000 {
		bad("modules.log_lines", "%d is out of range 1..100000", m.LogLines)
	}
}

// SystemModulesDir is the catalog of a node on the system data directory
// (/var/lib/meshbox): configuration lives in /etc.
const SystemModulesDir = "/etc/meshbox/modules"

// ModulesDir is the module catalog directory in use: modules.dir, else
// SystemModulesDir for the system data directory, else "modules" in the
// data directory. So the installed unit, `sudo meshbox doctor` and a node
// run by hand as root all read the same catalog.
func (c Config) ModulesDir() string {
	switch {
	case c.Modules.Dir != "":
		return c.Modules.Dir
	case filepath.Clean(c.DataDir) == "/var/lib/meshbox":
		return SystemModulesDir
	}
	return filepath.Join(c.DataDir, "modules")
}

// modulesRunDir is where the modules' runtime directories go.
func (c Config) modulesRunDir() string {
	if c.Modules.RunDir != "" {
		return c.Modules.RunDir
	}
	return filepath.Join(c.DataDir, "run")
}

// The node's own API for modules, on its NATS server.
const (
	// SubjectModules answers with the status of every assigned module
	// ([]modules.Status).
	SubjectModules = wire.SubjectModules
	// SubjectModuleControl takes a ModuleRequest with Action start, stop
	// or restart and answers a ModuleReply.
	SubjectModuleControl = wire.SubjectModuleControl
	// SubjectModuleLogs takes a ModuleRequest (Module, Lines) and answers
	// a ModuleReply with the module's last lines.
	SubjectModuleLogs = wire.SubjectModuleLogs
	// SubjectModuleLogPrefix + module name carries each new line of a
	// module's output as it is written (a modules.LogLine).
	SubjectModuleLogPrefix = wire.SubjectModuleLogPrefix
)

// ModuleRequest asks something of one module.
type ModuleRequest struct {
	Module string `json:"module"`
	Action string `json:"action,omitempty"` // start, stop or restart (SubjectModuleControl)
	Lines  int    `json:"lines,omitempty"`  // how many lines (SubjectModuleLogs; 0: all kept)
}

// ModuleReply answers a ModuleRequest.
type ModuleReply struct {
	Error string            `json:"error,omitempty"`
	Lines []modules.LogLine `json:"lines,omitempty"`
}

// startModules starts the supervisor of the assigned modules: the stages
// they declare are declared on the broker first, then the modules with
// autostart start. hosted is the snapshot of local interest the bridge
// and the node got. a.mu is held; NATS, the bridge and the node run.
func (a *Appliance) startModules(ctx context.Context, hosted []string) error {
	m := a.cfg.Modules
	sup, err := modules.New(modules.Config{
		Node:    a.cfg.Node,
		Catalog: a.cfg.ModulesDir(),
		RunDir:  a.cfg.modulesRunDir(),
		NATSURL: a.NATSURL(),
		// Modules find their programs where the node's own environment
		// says (and get nothing else of it).
		Path:              os.Getenv("PATH"),
		Credentials:       a.moduleCredentials,
		OpenGrant:         a.OpenGrant,
		Restart:           backoff.Policy{Min: m.RestartMin.D(), Max: m.RestartMax.D()},
		CrashLoopRestarts: m.CrashLoopRestarts,
		CrashLoopWindow:   m.CrashLoopWindow.D(),
		CrashLoopRetry:    m.CrashLoopRetry.D(),
		LogLines:          m.LogLines,
		Logger:            a.logger,
		OnLine:            a.publishModuleLine,
		Guard:             a.moduleGuard,
	})
	if err != nil {
		return fmt.Errorf("modules: %w", err)
	}
	r := a.update(func(r *running) { r.mods = sup })
	if _, err := r.nc.Subscribe(SubjectModules, func(msg *nats.Msg) {
		data, _ := json.Marshal(sup.Status()) // plain values: cannot fail
		a.respond(msg, data)
	}); err != nil {
		return fmt.Errorf("serve %s: %w", SubjectModules, err)
	}
	if _, err := r.nc.Subscribe(SubjectModuleControl, func(msg *nats.Msg) {
		if a.adminRequest(msg) {
			a.answerModule(msg, sup, true)
		}
	}); err != nil {
		return fmt.Errorf("serve %s: %w", SubjectModuleControl, err)
	}
	if _, err := r.nc.Subscribe(SubjectModuleLogs, func(msg *nats.Msg) { a.answerModule(msg, sup, false) }); err != nil {
		return fmt.Errorf("serve %s: %w", SubjectModuleLogs, err)
	}
	sup.SetHosted(hosted)
	// From now on bindingsChanged applies every change too. One that
	// landed between Current and Prepare below would be overtaken by this
	// older plan: look again until the bindings applied are the newest.
	for applied := ""; ; {
		snap, ok := r.bindings.manager.Current()
		if !ok || snap.Hash == applied {
			return nil
		}
		a.applyModules(ctx, sup, snap.Bindings)
		applied = snap.Hash
	}
}

// applyModules hands the stages of the assigned modules to the bridge and
// then the assignments to the supervisor: a stage's queue exists before
// its handler can run.
func (a *Appliance) applyModules(ctx context.Context, sup *modules.Supervisor, b cache.Bindings) {
	plan := sup.Prepare(b)
	if br := a.parts().bridge; br != nil {
		dctx, cancel := context.WithTimeout(ctx, declareTimeout)
		err := br.SetDeclaredStages(dctx, plan.DeclaredStages())
		cancel()
		if err != nil {
			a.logger.Warn("stage queues of assigned modules not declared yet; the bridge declares them when it reconnects", "err", err)
		}
	}
	sup.Apply(plan)
}

// answerModule serves SubjectModuleControl (control) and
// SubjectModuleLogs.
func (a *Appliance) answerModule(msg *nats.Msg, sup *modules.Supervisor, control bool) {
	var req ModuleRequest
	var rep ModuleReply
	err := json.Unmarshal(msg.Data, &req)
	switch {
	case err != nil:
		err = fmt.Errorf("bad request: %w", err)
	case !control:
		rep.Lines, err = sup.Logs(req.Module, req.Lines)
	case req.Action == "start":
		err = sup.Start(req.Module)
	case req.Action == "stop":
		err = sup.Stop(req.Module)
	case req.Action == "restart":
		err = sup.Restart(req.Module)
	default:
		err = fmt.Errorf("unknown action %q (start, stop, restart)", req.Action)
	}
	if err != nil {
		rep.Error = err.Error()
	} else if control {
		a.logger.Info("module "+req.Action+" by hand", "module", req.Module)
	}
	data, _ := json.Marshal(rep) // plain values: cannot fail
	a.respond(msg, data)
}

// publishModuleLine hands a line of a module's output to followers of
// `meshbox module logs -f`.
func (a *Appliance) publishModuleLine(module string, l modules.LogLine) {
	nc := a.parts().nc
	if nc == nil {
		return
	}
	data, _ := json.Marshal(l) // plain values: cannot fail
	_ = nc.Publish(SubjectModuleLogPrefix+module, data)
}

// moduleCredentials makes or updates a module's own local NATS
// credential: a local program (see PutProgram) with the permissions its
// manifest declares, so a module can host, serve, call, submit, publish
// and subscribe to what it declares and nothing else.
func (a *Appliance) moduleCredentials(module string, perms modules.Permissions) (modules.Credential, error) {
	p := programs.Program{
		Name:      moduleProgram(module),
		Host:      perms.Hosts.Capabilities,
		Serve:     perms.Hosts.Stages,
		Call:      perms.Uses.Capabilities,
		Submit:    perms.Uses.Stages,
		Publish:   perms.Uses.Publishes,
		Subscribe: perms.Uses.Subscribes,
	}
	path, err := a.PutProgram(p)
	if err != nil {
		return modules.Credential{}, fmt.Errorf("module %s: %w", module, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return modules.Credential{}, fmt.Errorf("module %s: %w", module, err)
	}
	return modules.Credential{File: data, InboxPrefix: p.InboxPrefix()}, nil
}

// moduleProgram is the local program name of a module's credential:
// "module-" and its name, or, for a name a program name cannot hold (dots,
// length), its name made safe and a hash of the real one so that two
// modules never share a credential.
func moduleProgram(module string) string {
	if n := "module-" + module; programs.CheckName(n) == nil {
		return n
	}
	safe := []byte(module)
	for i, c := range safe {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			safe[i] = '_'
		}
	}
	if len(safe) > 40 {
		safe = safe[:40]
	}
	sum := sha256.Sum256([]byte(module))
	return "module-" + string(safe) + "-" + hex.EncodeToString(sum[:4])
}

// SetModuleGuard sets the command of the module guard (see
// modules.RunGuard): the meshbox binary's "module-guard", which kills
// what is left of every module's process group when the node dies. Call
// it before Start; without it only a module's own process dies with the
// node.
func (a *Appliance) SetModuleGuard(argv []string) { a.moduleGuard = argv }

// stopModules stops every module, before anything they use stops. a.mu
// is held.
func (a *Appliance) stopModules() error {
	sup := a.parts().mods
	if sup == nil {
		return nil
	}
	a.update(func(r *running) { r.mods = nil })
	start := time.Now()
	err := sup.Close()
	a.logger.Info("modules stopped", "took", time.Since(start).Round(time.Millisecond))
	if err != nil {
		return fmt.Errorf("modules: %w", err)
	}
	return nil
}

// modulesDegraded lists the readiness remarks of the modules: a
// crash-looping module degrades the node.
func modulesDegraded(list []modules.Status) []string {
	var out []string
	for _, st := range list {
		if st.State == modules.StateCrashLooping {
			out = append(out, fmt.Sprintf("module %s is crash-looping: %s", st.Module, st.Error))
		}
	}
	return out
}
