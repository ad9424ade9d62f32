package appliance

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/meshbox/meshbox/bridge"
	brokerlink "github.com/meshbox/meshbox/bridge/link"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/brokerurl"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/node"
	"github.com/nats-io/nats.go"
)

// brokerURL is the broker the node should use now: the --broker override,
// else the broker.url mesh setting of the bindings in use with the node's
// own broker credential from them, else none.
func (a *Appliance) brokerURL(snap cache.Snapshot, ok bool) string {
	if a.cfg.Broker != "" {
		return string(a.cfg.Broker)
	}
	if !ok {
		return ""
	}
	return withBrokerCredential(snap.Bindings.Settings["broker.url"], snap.Bindings.Broker)
}

// allowedStages returns the stage allow-list that governs the node's
// broker user: its bindings' when it connects with its own credential
// from them; nil (none known) on a broker URL of its configuration, or
// without a credential of its own.
func (a *Appliance) allowedStages(snap cache.Snapshot, ok bool) []string {
	if a.cfg.Broker != "" || !ok || snap.Bindings.Broker == nil {
		return nil
	}
	return snap.Bindings.Stages
}

// brokerOverride names the setting the broker URL comes from when it
// overrides the bindings (Config.Broker); "" when the bindings name it.
func (a *Appliance) brokerOverride() string {
	if a.cfg.Broker == "" {
		return ""
	}
	return "the node's setting " + SettingSources("broker")
}

// NodeBrokerURL returns the URL a node connects to the broker with: the
// broker.url setting raw with the node's own credential from its bindings
// (cred; nil: raw as it is).
func NodeBrokerURL(raw string, cred *cache.BrokerCredential) string {
	return withBrokerCredential(raw, cred)
}

// withBrokerCredential returns the broker URLs raw (where the brokers are:
// one URL or several separated by commas) with the user and password of
// cred on each; raw as it is without a credential, and a URL that does
// not parse as it is (the bridge then says why).
func withBrokerCredential(raw string, cred *cache.BrokerCredential) string {
	if raw == "" || cred == nil {
		return raw
	}
	return brokerurl.Map(raw, func(one string) string {
		u, err := url.Parse(one)
		if err != nil {
			return one
		}
		u.User = url.UserPassword(cred.User, cred.Password.Reveal())
		return u.String()
	})
}

// startBridge starts the link to the broker. hosted is the first snapshot
// of local interest. a.mu is held.
func (a *Appliance) startBridge(ctx context.Context, hosted []string) error {
	r := a.parts()
	snap, ok := r.bindings.manager.Current()
	natsSrv := r.nats
	bc := a.cfg.Bridge // the settings; the rest is this node's
	bc.Node = a.cfg.Node
	bc.URL = a.brokerURL(snap, ok)
	bc.URLOverride = a.brokerOverride()
	bc.OutboxPath = filepath.Join(a.cfg.DataDir, "outbox.db")
	bc.Dial = func(opts ...nats.Option) (*nats.Conn, error) {
		nc, err := natsSrv.Connect(ownConnPrefix+"bridge", opts...)
		if err == nil {
			r.interest.exclude(nc) // the stand-ins host nothing here
		}
		return nc, err
	}
	bc.OnSystem = func(key string, body []byte, origin string) {
		if n := a.parts().node; n != nil {
			n.HandleSystem(key, body, origin)
		}
	}
	bc.OnConnected = func() {
		r.linkUp.Store(true)
		if n := a.parts().node; n != nil && r.linkUp.Swap(false) {
			n.LinkUp() // discovery tries again at once
		}
		if eng := a.parts().rows; eng != nil {
			eng.LinkUp() // so do the tables' logs
		}
	}
	bc.OnNewerGeneration = r.bindings.manager.Refresh // a peer switched to a generation not read here yet
	bc.OnCredential = a.credentialChanged
	bc.AcceptedBefore = a.credentialAcceptedBefore
	bc.Replies = r.replies.Conn()
	bc.Local = natsSrv.Rights()
	bc.Logger = a.logger
	bc.Metrics = a.tel.registry
	if kk := r.keys; kk != nil {
		bc.Keys = kk.Ring() // a mesh seals
	}
	b, err := bridge.New(bc, r.nc)
	if err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	if ok { // before Start: the first deliveries are checked too
		b.SetSenderGenerations(snap.Bindings.SenderGenerations())
	}
	b.SetAllowedStages(a.allowedStages(snap, ok))
	b.SetEventInterest(r.interest.eventPatterns())          // the first check's, like hosted: the watcher does not run yet
	if err := b.SetLocalInterest(ctx, hosted); err != nil { // before Start: only recorded
		_ = b.Close()
		return fmt.Errorf("bridge: %w", err)
	}
	if err := b.Start(ctx); err != nil {
		_ = b.Close()
		return err
	}
	// When the first session is up already, its stage queues now exist
	// before the node says hello.
	if err := b.SetLocalInterest(ctx, hosted); err != nil {
		a.logger.Warn("stage queues not declared yet; the bridge declares them when it consumes", "err", err)
	}
	a.update(func(r *running) { r.bridge = b })
	// A bindings change may have landed between Current and update above.
	if snap, ok := r.bindings.manager.Current(); ok {
		a.followBroker(b, snap, ok)
	}
	if r.bindings.db != nil {
		a.wg.Add(1)
		go func() { // the switch recorder: exits when the appliance closes
			defer a.wg.Done()
			a.runSwitchRecorder()
		}()
		a.credentialChanged("")
	}
	a.wg.Add(1)
	go func() { // exits when the bridge reports a fatal error or the appliance closes
		defer a.wg.Done()
		select {
		case err := <-b.Fatal():
			select {
			case a.fatal <- err:
			default:
			}
		case <-a.quit:
		}
	}()
	return nil
}

// credentialGrace is how long the node waits, once its bindings show it
// a newer broker credential of its own, before it switches to it. Its
// peers read the new generation from the same change of the bindings, and
// until they have, they refuse what it sends under the new user as forged
// (a generation newer than their bindings list): the grace lets them
// catch up, at the cost of a second in a rotation that waits for the
// switch anyway.
const credentialGrace = time.Second

// brokerFollow is the broker URL the appliance handed the bridge, and
// whether a switch to a newer credential waits out its grace.
type brokerFollow struct {
	mu      sync.Mutex // guards set, waiting
	set     string
	waiting bool
	// credWake (cap 1) makes the recorder of credential switches look
	// again (credential.go).
	credWake chan struct{}
}

// followBroker moves the bridge to the broker the bindings name, when they
// name another one than it uses; to a newer credential of this node's
// after credentialGrace.
func (a *Appliance) followBroker(b *bridge.Bridge, snap cache.Snapshot, ok bool) {
	want := a.brokerURL(snap, ok)
	if want == "" || a.cfg.Broker != "" {
		return
	}
	f := &a.follow
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.set != "" && newerGeneration(f.set, want) {
		if !f.waiting {
			f.waiting = true
			time.AfterFunc(credentialGrace, func() {
				f.mu.Lock()
				f.waiting = false
				f.mu.Unlock()
				select {
				case <-a.quit:
					return
				default:
				}
				bd := a.parts().bindings
				if bd == nil {
					return // closed meanwhile
				}
				if snap, ok := bd.manager.Current(); ok {
					f.mu.Lock()
					defer f.mu.Unlock()
					a.setBrokerURL(b, a.brokerURL(snap, ok))
				}
			})
		}
		return
	}
	a.setBrokerURL(b, want)
}

// setBrokerURL hands url to the bridge; a.follow.mu is held.
func (a *Appliance) setBrokerURL(b *bridge.Bridge, url string) {
	if url == "" {
		return
	}
	if err := b.SetURL(url); err != nil {
		a.logger.Error("broker.url setting rejected; staying on the current broker", "err", err, "url", RedactURL(url))
		return
	}
	a.follow.set = url
}

// newerGeneration says whether want's broker user is a newer generation
// of the same node's user than cur's.
func newerGeneration(cur, want string) bool {
	user := func(raw string) string {
		u, err := url.Parse(raw)
		if err != nil || u.User == nil {
			return ""
		}
		return u.User.Username()
	}
	cn, cg, ok1 := wire.ParseBrokerUser(user(cur))
	wn, wg, ok2 := wire.ParseBrokerUser(user(want))
	return ok1 && ok2 && cn == wn && wg > cg
}

// startNode starts the node's view of the mesh: local capabilities,
// discovery, peers, the routes for the bridge's stand-ins. hosted is the
// snapshot of local interest the bridge got. a.mu is held.
func (a *Appliance) startNode(ctx context.Context, hosted []string) error {
	r := a.parts()
	b := r.bridge
	var signer node.Signer
	if kk := r.keys; kk != nil {
		signer = kk.Signer() // a mesh signs its discovery
	}
	n, err := node.New(node.Config{
		Name:              a.cfg.Node,
		Version:           Build().Version,
		StartedAt:         r.startedAt,
		Link:              staticRoutes{Bridge: b, static: a.cfg.Bridge.Routes},
		Signer:            signer,
		Conn:              r.nc,
		Replies:           r.replies.Conn(),
		DiscoveryInterval: a.cfg.Mesh.DiscoveryInterval.D(),
		HeartbeatInterval: a.cfg.Mesh.HeartbeatInterval.D(),
		MissedHeartbeats:  a.cfg.Mesh.MissedHeartbeats,
		NoRoute:           func(err error) bool { return errors.Is(err, bridge.ErrNoRoute) },
		// The bridge reports each connection (OnConnected: LinkUp), so
		// without a connected link discovery waits for that.
		Connected: b.Connected,
		// Command batches and order keys only while every peer reads them.
		OnPeerProtocols: func(oldest int) {
			b.SetCommandBatching(oldest >= node.BatchProtocolVersion)
			b.SetOrderKeys(oldest >= node.OrderKeyProtocolVersion)
		},
		// The event lanes of the nodes it knows of.
		OnEventPeers: b.SetEventPeers,
		// Snapshot parts in binary once every node reads them.
		OnKnownProtocols: func(oldest int) { r.knownProtocol.Store(int32(oldest)) },
		// What they listen to: no event goes to the broker for nobody.
		OnEventListeners: func(l *node.Listeners) {
			b.SetEventListeners(l.All, l.Why, l.Patterns, l.Wants, l.Since)
		},
		Logger:     a.logger,
		Registerer: a.tel.registry,
	})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.SetListening(r.interest.eventPatterns())
	// The previous run's bindings stay a while: say so, so that their
	// events keep coming while programs come back.
	n.KeepListening(brokerlink.PriorEventPatterns(filepath.Join(a.cfg.DataDir, brokerlink.EventRecordFile)), r.startedAt.Add(brokerlink.EventKeepAfterStart))
	n.SetLocal(hosted)
	if snap, ok := r.bindings.manager.Current(); ok {
		a.applyToNode(n, snap)
	}
	n.SetHealth(HealthOf(a.Status())) // its hello carries it
	r.linkUp.Store(false)             // a connection before Start is one Start hears of
	if err := n.Start(ctx); err != nil {
		_ = n.Close()
		return fmt.Errorf("node: %w", err)
	}
	a.update(func(r *running) { r.node = n })
	if r.linkUp.Swap(false) {
		// The link connected between Start and update: the node has not
		// heard of it (its view of what the others listen to counts from
		// there, link.EventBinder).
		n.LinkUp()
	}
	// A bindings change may have landed between Current and update above.
	if snap, ok := r.bindings.manager.Current(); ok {
		a.applyToNode(n, snap)
	}
	a.wg.Add(1)
	go a.shareHealth(n) // exits when the appliance closes
	return nil
}

// applyToNode tells the node which peers the bindings expect, their
// signing keys and which revision it runs.
func (a *Appliance) applyToNode(n *node.Node, snap cache.Snapshot) {
	names := make([]string, 0, len(snap.Bindings.Nodes))
	for _, rec := range snap.Bindings.Nodes {
		if rec.Name != a.cfg.Node {
			names = append(names, rec.Name)
		}
	}
	if err := n.SetExpected(names); err != nil {
		a.logger.Warn("node records not applied to the mesh view", "err", err)
	}
	keys := map[string]ed25519.PublicKey{}
	for name, pub := range snap.Bindings.SigningKeys() {
		keys[name] = pub
	}
	n.SetSigningKeys(keys)
	n.SetRevision(snap.Revision)
}

// ownConnPrefix names the node's own NATS connections (API, bridge); the
// watcher of local interest knows them by their client ids.
const ownConnPrefix = "meshbox-"

// staticRoutes is the node's link to the bridge, with the routes of the
// configuration (bridge.routes) kept under the ones discovery finds: the
// node replaces the bridge's routes wholesale on every change of its view.
type staticRoutes struct {
	*bridge.Bridge
	static map[string]string
}

// SetRoutes hands the bridge the discovered routes plus the static ones.
func (l staticRoutes) SetRoutes(routes map[string][]string) {
	merged := make(map[string][]string, len(routes)+len(l.static))
	for name, nodes := range routes {
		merged[name] = nodes
	}
	for name, host := range l.static {
		if !slices.Contains(merged[name], host) {
			merged[name] = append(slices.Clone(merged[name]), host)
		}
	}
	l.Bridge.SetRoutes(merged)
}

// peersUp names the peers that are up now (none standalone): whom micro
// discovery asks.
func (a *Appliance) peersUp() []string {
	n := a.parts().node
	if n == nil {
		return nil
	}
	var peers []string
	for _, p := range n.Peers() {
		if p.State == node.StateUp {
			peers = append(peers, p.Name)
		}
	}
	return peers
}
