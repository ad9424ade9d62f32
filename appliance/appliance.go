package appliance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/meshbox/meshbox/appliance/localnats"
	"github.com/meshbox/meshbox/appliance/modules"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/redact"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Appliance is one running meshbox node. Build it with New, run it with
// Start, stop it with Close. Its methods are safe for concurrent use.
//
// Lifecycle and status are kept apart: mu serializes Start and Close,
// which may take long (a broker that does not answer, a slow disk), while
// Status, Readiness and the HTTP handlers never take it. They read the
// phase and the running parts Start has published (run), so they answer
// at once while the node starts and while it stops.
type Appliance struct {
	cfg    Config
	logger *slog.Logger
	tel    telemetry // what the node records of itself

	// mu is held by Start and Close for their whole run: they alone
	// write closed and run.
	mu     sync.Mutex
	closed bool
	// run is the node's running parts (running.go), published by Start
	// as each starts and by Close before it stops each; nil before Start.
	run   atomic.Pointer[running]
	phase atomic.Int32 // a phase
	// cancelStart cancels the context of a Start in progress, so that Close
	// does not wait for a start that waits on the network.
	cancelStart atomic.Pointer[context.CancelFunc]

	// moduleGuard is the module guard's command (SetModuleGuard; nil: none).
	moduleGuard []string
	follow      brokerFollow // the broker URL handed to the bridge (mesh.go), the credential switch's wake-up

	// fatal receives an error when a component fails in a way that should
	// stop the node (for example: the node name is claimed on the broker).
	fatal chan error
	quit  chan struct{}  // closed by Close: owned goroutines exit
	wg    sync.WaitGroup // goroutines owned by the appliance

	snaps *snapshots // backups: copies of the files in use, and the backup the data directory came from (snapshot.go)

	hook func(point string) // tests only: called at the named points of the lifecycle
}

// telemetry is what the node records of itself: its recent errors (the
// status's), its recent history (trends.go) and its metrics.
type telemetry struct {
	errs     *errorRing
	trends   *trendRing
	registry *prometheus.Registry
}

// The phases of an appliance's life, in order.
const (
	phaseNew int32 = iota
	phaseStarting
	phaseRunning
	phaseStopping
	phaseStopped
)

// hookStopping is the lifecycle point where Close has said it is stopping
// and stops nothing yet.
const hookStopping = "stopping"

// New validates cfg and returns an appliance that is not yet started.
// logger may be nil (no logging).
func New(cfg Config, logger *slog.Logger) (*Appliance, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ring := newErrorRing(50)
	// Secrets are hidden before a record reaches the ring (the status)
	// or the log.
	logger = slog.New(redact.NewHandler(&ringHandler{next: logger.Handler(), ring: ring})).With("node", cfg.Node)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(newNodeCollector(ring))
	a := &Appliance{
		cfg:    cfg,
		logger: logger,
		tel:    telemetry{errs: ring, registry: reg, trends: newTrendRing(trendSamples)},
		fatal:  make(chan error, 1),
		quit:   make(chan struct{}),
		follow: brokerFollow{credWake: make(chan struct{}, 1)},
		snaps:  newSnapshots(reg),
	}
	reg.MustRegister(newModulesCollector(func() *modules.Supervisor { return a.parts().mods }))
	reg.MustRegister(blobsCollector{srv: func() *blobs.Server { return a.parts().blobs }})
	reg.MustRegister(mqttRefusalsCollector{nats: func() *localnats.Server { return a.parts().nats }})
	reg.MustRegister(mqttAcceptCollector{nats: func() *localnats.Server { return a.parts().nats }})
	return a, nil
}

// Start brings the node up: data directory and bindings cache, embedded NATS
// server, bridge, node, HTTP. It returns once the node serves local programs,
// or the first error, after undoing what it had started.
func (a *Appliance) Start(ctx context.Context) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.cancelStart.Store(&cancel)
	defer a.cancelStart.Store(nil)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	if a.run.Load() != nil {
		return errors.New("appliance already started")
	}
	a.run.Store(&running{startedAt: time.Now().UTC(), linkUp: new(atomic.Bool), knownProtocol: new(atomic.Int32)})
	a.phase.CompareAndSwap(phaseNew, phaseStarting)
	defer func() {
		if err != nil {
			a.closeLocked()
		}
	}()

	if err := os.MkdirAll(a.cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	if err := checkDataOwner(a.cfg.DataDir); err != nil {
		return err
	}
	a.noteRestored()
	// HTTP first: status and readiness answer for the whole start.
	if a.cfg.HTTP != "off" {
		if err := a.startHTTP(); err != nil {
			return err
		}
	}
	bd, err := openBindings(ctx, a.cfg, a.logger, a.tel.registry, a.bindingsChanged) // components name themselves in their logs
	if err != nil {
		return err
	}
	a.update(func(r *running) { r.bindings = bd })
	if a.cfg.DB != "" {
		if err := a.startKeys(); err != nil {
			return err
		}
	}

	natsSrv, err := a.startLocalNATS()
	if err != nil {
		return err
	}
	a.update(func(r *running) { r.nats = natsSrv })
	nc, err := natsSrv.Connect(ownConnPrefix + "api")
	if err != nil {
		return fmt.Errorf("nats connect: %w", err)
	}
	a.update(func(r *running) { r.nc = nc })
	replies, err := natsSrv.Responder(ownConnPrefix+"responder", a.logger)
	if err != nil {
		return fmt.Errorf("nats connect: %w", err)
	}
	a.update(func(r *running) { r.replies = replies })
	if err := a.serveAPI(); err != nil {
		return err
	}
	if err := a.serveReload(); err != nil {
		return err
	}
	if err := a.serveProgramMQTT(); err != nil {
		return err
	}
	if err := natsSrv.ServeMicro(localnats.MicroConfig{
		Node: a.cfg.Node, Conn: nc, Replies: replies, Peers: a.peersUp,
		Logger: a.logger, Registerer: a.tel.registry,
	}); err != nil {
		return err
	}
	interest := newInterestWatcher(natsSrv.NATS())
	interest.exclude(nc)
	interest.exclude(replies.Conn()) // the responder subscribes nothing: not a program to watch for
	a.update(func(r *running) { r.interest = interest })
	if err := interest.hearConnects(nc); err != nil {
		a.logger.Warn("the watcher of local interest polls even while no program is connected", "err", err)
	}
	if err := a.startBlobs(ctx); err != nil {
		return err
	}
	if err := a.startRows(); err != nil {
		return err
	}
	if err := a.startRetained(ctx); err != nil {
		return err
	}
	hosted, _, err := interest.check()
	if err != nil {
		return err
	}
	if err := a.startBridge(ctx, hosted); err != nil {
		return err
	}
	if err := a.startNode(ctx, hosted); err != nil {
		return err
	}
	if err := a.startModules(ctx, hosted); err != nil {
		return err
	}
	a.startWatchingInterest()
	a.wg.Add(1)
	go a.runTrends() // exits when the appliance closes
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("start: %w", err) // Close was called meanwhile
	}
	a.phase.CompareAndSwap(phaseStarting, phaseRunning)
	return nil
}

// Fatal returns a channel that yields an error when a component fails in a
// way that should stop the node.
func (a *Appliance) Fatal() <-chan error { return a.fatal }

// NATSURL is the client URL of the embedded NATS server ("" before Start).
func (a *Appliance) NATSURL() string {
	if n := a.parts().nats; n != nil {
		return n.URL()
	}
	return ""
}

// HTTPURL is the base URL of the status endpoints ("" when off or before
// Start).
func (a *Appliance) HTTPURL() string {
	return a.parts().httpURL
}

// DataDir is the node's data directory.
func (a *Appliance) DataDir() string { return a.cfg.DataDir }

// Logger is the node's logger.
func (a *Appliance) Logger() *slog.Logger { return a.logger }

// Close stops the node in the reverse order of Start. It is idempotent, safe
// after a failed or partial Start, and returns when every goroutine the node
// started is gone. It says at once that the node is stopping, cancels a
// Start in progress, and keeps the HTTP listener up until the rest has
// stopped, so that readiness shows "node is stopping" meanwhile.
func (a *Appliance) Close() error {
	a.phase.Store(phaseStopping)
	if cancel := a.cancelStart.Load(); cancel != nil {
		(*cancel)()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	return a.closeLocked()
}

// closeLocked stops whatever is running. a.mu is held on entry.
func (a *Appliance) closeLocked() error {
	a.phase.Store(phaseStopping)
	if a.hook != nil {
		a.hook(hookStopping)
	}
	var errs []error
	select {
	case <-a.quit:
	default:
		close(a.quit)
	}
	// The commands their handlers hold first (up to a second), then the
	// modules: they use the node's NATS server and the mesh.
	if b := a.parts().bridge; b != nil {
		b.FinishCommands()
	}
	if err := a.stopModules(); err != nil {
		errs = append(errs, err)
	}
	if n := a.parts().node; n != nil {
		a.update(func(r *running) { r.node = nil })
		if err := n.Close(); err != nil {
			errs = append(errs, fmt.Errorf("node: %w", err))
		}
	}
	if b := a.parts().bridge; b != nil {
		a.update(func(r *running) { r.bridge = nil })
		if err := b.Close(); err != nil {
			errs = append(errs, fmt.Errorf("bridge: %w", err))
		}
	}
	a.stopRetained()
	a.stopRows()
	if kk := a.parts().keys; kk != nil {
		a.update(func(r *running) { r.keys = nil })
		kk.Close()
	}
	a.stopBlobs()
	if nc := a.parts().nc; nc != nil {
		a.update(func(r *running) { r.nc = nil })
		nc.Close()
	}
	if rp := a.parts().replies; rp != nil {
		a.update(func(r *running) { r.replies = nil })
		rp.Close()
	}
	if n := a.parts().nats; n != nil {
		a.update(func(r *running) { r.nats = nil })
		n.Close()
	}
	if bd := a.parts().bindings; bd != nil {
		a.update(func(r *running) { r.bindings = nil })
		if err := bd.close(); err != nil {
			errs = append(errs, err)
		}
	}
	// Last: the status endpoints answer while the rest stops. Handlers never
	// wait on Close, so this waits only for slow clients.
	if srv := a.parts().http; srv != nil {
		a.update(func(r *running) { r.http = nil })
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		if err := srv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("http: %w", err))
		}
		cancel()
	}
	a.wg.Wait()
	a.phase.Store(phaseStopped)
	return errors.Join(errs...)
}

// serveAPI answers the node's own NATS API ($MESH.>). a.mu is held.
func (a *Appliance) serveAPI() error {
	_, err := a.parts().nc.Subscribe(SubjectStatus, func(m *nats.Msg) {
		data, err := json.Marshal(a.Status())
		if err != nil {
			a.logger.Error("encode status", "err", err)
			return
		}
		a.respond(m, data)
	})
	if err != nil {
		return fmt.Errorf("serve %s: %w", SubjectStatus, err)
	}
	if err := a.serveBackup(); err != nil {
		return err
	}
	return a.serveDeadLetters()
}

// The node's own API subjects on its NATS server.
const (
	SubjectStatus = wire.SubjectStatus
)

// startHTTP listens and serves status, health and metrics. a.mu is held.
func (a *Appliance) startHTTP() error {
	ln, err := net.Listen("tcp", a.cfg.HTTP)
	if err != nil {
		return fmt.Errorf("http listen %s: %w", a.cfg.HTTP, err)
	}
	srv := &http.Server{
		Handler:           newHostGuard(ln.Addr().String(), a.cfg.HTTPHosts, a.handler()),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(a.logger.With("component", "http").Handler(), slog.LevelWarn),
	}
	a.update(func(r *running) { r.httpURL, r.http = "http://"+ln.Addr().String(), srv })
	a.wg.Add(1)
	go func() { // exits when Shutdown closes the listener (closeLocked)
		defer a.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.logger.Error("http server stopped", "err", err)
		}
	}()
	return nil
}

// bindingsChanged applies a new version of the bindings to the running
// node. It runs on the bindings manager's goroutine, one change at a time.
func (a *Appliance) bindingsChanged(snap cache.Snapshot, div cache.Divergence) {
	r := a.parts()
	if kk := r.keys; kk != nil {
		kk.Apply(snap) // before anything that may send
	}
	if b := r.bridge; b != nil {
		b.SetSenderGenerations(snap.Bindings.SenderGenerations())
		a.followBroker(b, snap, true)
		b.SetAllowedStages(a.allowedStages(snap, true)) // a grant reaches the handlers serving the stage already
		b.ScopesChanged()                               // the stages it may host follow the scopes just applied
	}
	a.credentialChanged("")
	if n := r.node; n != nil {
		a.applyToNode(n, snap)
	}
	if sup := r.mods; sup != nil {
		a.applyModules(context.Background(), sup, snap.Bindings)
	}
	if eng := r.rows; eng != nil {
		a.applyTables(eng, snap)
	}
}
