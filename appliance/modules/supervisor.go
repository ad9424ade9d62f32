package modules

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/backoff"
)

// Defaults of Config.
const (
	DefaultRestartMin        = time.Second
	DefaultRestartMax        = time.Minute
	DefaultCrashLoopRestarts = 5
	DefaultCrashLoopWindow   = 2 * time.Minute
	DefaultCrashLoopRetry    = 5 * time.Minute
	DefaultLogLines          = 500
)

// Config configures a Supervisor.
type Config struct {
	// Node is this node's mesh name (MESHBOX_NODE of every module).
	Node string
	// Catalog is the module catalog directory (see LoadCatalog).
	Catalog string
	// RunDir holds each module's private runtime directory.
	RunDir string
	// NATSURL is the node's NATS server as modules reach it (NATS_URL).
	NATSURL string
	// Path is the PATH modules get and bare commands are looked up in.
	Path string
	// Credentials, when set, makes (or updates) a module's own local NATS
	// credential with the permissions its manifest declares. The file is
	// copied into the module's runtime directory, owned by the module's
	// user, and named in NATS_NKEY, with the inbox prefix its permissions
	// allow in NATS_INBOX_PREFIX. nil: modules get NATS_URL alone.
	Credentials func(module string, perms Permissions) (Credential, error)
	// OpenGrant opens a grant's sealed credential (nil: sealed grants
	// cannot be written and their module fails to start, visibly).
	OpenGrant GrantOpener
	// Restart is the backoff between restarts of a failing module
	// (defaults DefaultRestartMin, DefaultRestartMax).
	Restart backoff.Policy
	// A module that fails CrashLoopRestarts times within CrashLoopWindow is
	// crash-looping: it is tried again only every CrashLoopRetry. A run
	// that lasted CrashLoopWindow counts as a success.
	CrashLoopRestarts int
	CrashLoopWindow   time.Duration
	CrashLoopRetry    time.Duration
	// LogLines is how many lines of output are kept per module.
	LogLines int
	// Logger receives the supervisor's events and every line of output of
	// every module (attribute "module").
	Logger *slog.Logger
	// Guard is the command of the module guard (meshbox module-guard, see
	// RunGuard), which kills what is left of every module's process group
	// when the node dies; nil runs without one (a module's own process
	// still dies with the node on Linux).
	Guard []string
	// OnLine, when set, is called with every line of output, on the
	// reading goroutine of that module; it must not block.
	OnLine func(module string, l LogLine)
}

// States of a module, as Status.State shows them.
const (
	StateRunning      = "running"
	StateStarting     = "starting" // waiting to start, or to restart after a failure
	StateStopping     = "stopping"
	StateStopped      = "stopped"
	StateCrashLooping = "crash-looping"
	StateFailed       = "failed"         // it cannot run: a bad manifest, an unknown selection, a start that failed
	StateNotInCatalog = "not-in-catalog" // assigned, but the catalog has no such module
)

// Supervisor runs the modules assigned to this node: see the package
// comment. Its methods are safe for concurrent use.
type Supervisor struct {
	cfg   Config
	log   *slog.Logger
	sp    *spawner
	guard *guard // nil without Config.Guard

	mu      sync.Mutex // guards the fields below
	runners map[string]*runner
	hosted  map[string]bool // cap.* and work.* subjects local programs serve
	closed  bool
	// Plans are numbered as Prepare makes them; Apply ignores one older
	// than the last it applied (a manual start's re-read of the catalog
	// must not bring back bindings replaced meanwhile).
	planned uint64
	applied uint64
	last    cache.Bindings // the bindings of the last plan applied

	wg sync.WaitGroup // the runners' goroutines, those of unassigned modules still stopping included
}

// New validates cfg and returns a supervisor that runs nothing until
// Apply.
func New(cfg Config) (*Supervisor, error) {
	if cfg.Catalog == "" || cfg.RunDir == "" {
		return nil, fmt.Errorf("%w: catalog and run directory are required", ErrConfig)
	}
	if cfg.Restart.Min <= 0 {
		cfg.Restart.Min = DefaultRestartMin
	}
	if cfg.Restart.Max <= 0 {
		cfg.Restart.Max = DefaultRestartMax
	}
	if cfg.Restart.Max < cfg.Restart.Min {
		return nil, fmt.Errorf("%w: restart max %s below restart min %s", ErrConfig, cfg.Restart.Max, cfg.Restart.Min)
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&cfg.CrashLoopWindow, DefaultCrashLoopWindow}, {&cfg.CrashLoopRetry, DefaultCrashLoopRetry}} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	if cfg.CrashLoopRestarts <= 0 {
		cfg.CrashLoopRestarts = DefaultCrashLoopRestarts
	}
	if cfg.LogLines <= 0 {
		cfg.LogLines = DefaultLogLines
	}
	if cfg.Path == "" {
		cfg.Path = "/usr/local/bin:/usr/bin:/bin"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	var g *guard
	if len(cfg.Guard) > 0 {
		var err error
		if g, err = startGuard(cfg.Guard); err != nil {
			return nil, err
		}
	}
	return &Supervisor{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "modules"),
		sp:      newSpawner(),
		guard:   g,
		runners: map[string]*runner{},
		hosted:  map[string]bool{},
	}, nil
}

// spec is everything one run of a module depends on; a change of hash
// restarts it.
type spec struct {
	assignment cache.Assignment
	entry      Entry // Manifest nil when not runnable
	overrides  []cache.Override
	grants     []cache.Grant
	state      string // StateFailed or StateNotInCatalog when it cannot run
	err        error
	hash       string
}

// Plan is what a node's bindings ask of the supervisor, resolved against
// the catalog as it was read for it (Prepare).
type Plan struct {
	seq      uint64
	bindings cache.Bindings
	catalog  Catalog
	specs    map[string]spec
}

// DeclaredStages are the stages the assigned modules host, by their
// manifests: the node declares their queues on the broker before the
// modules start, so that commands for them wait instead of being refused.
func (p *Plan) DeclaredStages() []string {
	set := map[string]bool{}
	for _, sp := range p.specs {
		if sp.entry.Manifest != nil {
			for _, s := range sp.entry.Manifest.Hosts.Stages {
				set[s] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// CatalogError is why the catalog directory could not be read, or nil.
func (p *Plan) CatalogError() error { return p.catalog.Err }

// Prepare reads the catalog and resolves b's assignments against it.
func (s *Supervisor) Prepare(b cache.Bindings) *Plan {
	s.mu.Lock()
	s.planned++
	seq := s.planned
	s.mu.Unlock()
	return s.prepare(b, seq)
}

func (s *Supervisor) prepare(b cache.Bindings, seq uint64) *Plan {
	cat := LoadCatalog(s.cfg.Catalog)
	p := &Plan{seq: seq, bindings: b, catalog: cat, specs: map[string]spec{}}
	for _, a := range b.Assignments {
		sp := spec{assignment: a}
		for _, o := range b.Overrides {
			if o.Module == a.Module {
				sp.overrides = append(sp.overrides, o)
			}
		}
		e, ok := cat.Entries[a.Module]
		switch {
		case !ok && cat.Err != nil:
			sp.state, sp.err = StateFailed, cat.Err
		case !ok:
			sp.state, sp.err = StateNotInCatalog, fmt.Errorf("module %s is not in the catalog %s", a.Module, cat.Dir)
		case e.Err != nil:
			sp.state, sp.err = StateFailed, e.Err
		default:
			if _, ok := e.Manifest.Selections[a.Selection]; !ok {
				sp.state = StateFailed
				sp.err = fmt.Errorf("selection %q is not in the manifest of module %s (it has %s)",
					a.Selection, a.Module, strings.Join(e.Manifest.SelectionNames(), ", "))
				break
			}
			sp.entry = e
			for _, g := range b.Grants {
				for _, ref := range e.Manifest.Grants {
					if g.Resource == ref.Resource {
						sp.grants = append(sp.grants, g)
						break
					}
				}
			}
		}
		sp.hash = sp.computeHash()
		p.specs[a.Module] = sp
	}
	return p
}

// computeHash hashes what a run depends on (grants' credentials included:
// a rotated one restarts the module; the hash is never shown).
func (sp spec) computeHash() string {
	grants := make([]map[string]string, len(sp.grants))
	for i, g := range sp.grants {
		grants[i] = map[string]string{"r": g.Resource, "p": g.Provider, "c": g.Credential.Reveal()}
	}
	errText := ""
	if sp.err != nil {
		errText = sp.err.Error()
	}
	data, _ := json.Marshal(struct { // plain values: cannot fail
		A cache.Assignment
		M *Manifest
		O []cache.Override
		G []map[string]string
		S string
		E string
	}{sp.assignment, sp.entry.Manifest, sp.overrides, grants, sp.state, errText})
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// Apply makes the running modules what p asks: a module no longer
// assigned is stopped; a new one starts when its assignment says
// autostart; one whose assignment, overrides, grants or manifest changed
// is restarted (and its manual start or stop forgotten). Apply returns at
// once; stops and starts happen on each module's own goroutine.
func (s *Supervisor) Apply(p *Plan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || p.seq < s.applied {
		return
	}
	s.applied, s.last = p.seq, p.bindings
	if err := p.catalog.Err; err != nil {
		s.log.Error("cannot read the module catalog", "err", err)
	}
	for name, r := range s.runners {
		if _, ok := p.specs[name]; !ok {
			delete(s.runners, name)
			s.log.Info("module unassigned; stopping it", "module", name)
			r.end() // the runner stops the process and exits on its own
		}
	}
	for _, name := range slices.Sorted(maps.Keys(p.specs)) {
		sp := p.specs[name]
		r := s.runners[name]
		if r == nil {
			if sp.err != nil {
				s.log.Error("assigned module cannot run", "module", name, "err", sp.err)
			}
			r = newRunner(s, name, sp)
			s.runners[name] = r
			s.wg.Add(1)
			go func() { // exits when end (unassigned, or Close) closes r.quit, after stopping its process
				defer s.wg.Done()
				r.loop()
			}()
			continue
		}
		if r.update(sp) {
			if sp.err != nil {
				s.log.Error("assigned module cannot run", "module", name, "err", sp.err)
			} else {
				s.log.Info("module's assignment changed", "module", name, "selection", sp.assignment.Selection, "autostart", sp.assignment.Autostart)
			}
		}
	}
}

// SetHosted tells the supervisor what local programs serve on the node's
// NATS server (the cap.* and work.* subjects of the watcher of local
// interest), for the "declares but does not serve" warnings.
func (s *Supervisor) SetHosted(subjects []string) {
	set := make(map[string]bool, len(subjects))
	for _, sub := range subjects {
		set[sub] = true
	}
	s.mu.Lock()
	s.hosted = set // replaced, never changed: readers keep their copy
	s.mu.Unlock()
}

// hostedNow returns what local programs serve, as last set by SetHosted.
func (s *Supervisor) hostedNow() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hosted
}

// Start starts an assigned module that is stopped (or waiting to restart)
// and keeps it running until the next change of its assignment, a Stop,
// or the node's restart. It reads the catalog again first.
func (s *Supervisor) Start(name string) error { return s.control(name, ctlStart) }

// Stop stops an assigned module, autostarted or not, until the next change
// of its assignment, a Start, or the node's restart.
func (s *Supervisor) Stop(name string) error { return s.control(name, ctlStop) }

// Restart stops an assigned module if it runs and starts it again.
func (s *Supervisor) Restart(name string) error { return s.control(name, ctlRestart) }

func (s *Supervisor) control(name string, c ctl) error {
	if c != ctlStop {
		s.mu.Lock()
		b, seq := s.last, s.applied
		s.mu.Unlock()
		s.Apply(s.prepare(b, seq)) // the catalog as it is now
	}
	s.mu.Lock()
	r := s.runners[name]
	closed := s.closed
	s.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case r == nil:
		return fmt.Errorf("%w: %s", ErrUnknownModule, name)
	}
	return r.control(c)
}

// Logs returns up to n of the module's last lines of output (n <= 0: all
// that are kept).
func (s *Supervisor) Logs(name string, n int) ([]LogLine, error) {
	s.mu.Lock()
	r := s.runners[name]
	s.mu.Unlock()
	if r == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownModule, name)
	}
	return r.logs.last(n), nil
}

// Close stops every module (SIGTERM to each process group, SIGKILL after
// its grace, all at once) and returns when they are gone.
func (s *Supervisor) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	runners := slices.Collect(maps.Values(s.runners))
	s.runners = map[string]*runner{}
	s.mu.Unlock()
	for _, r := range runners {
		r.end()
	}
	s.wg.Wait()
	s.sp.close()
	s.guard.close()
	return nil
}
