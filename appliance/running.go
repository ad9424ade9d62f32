package appliance

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/meshbox/meshbox/appliance/keys"
	"github.com/meshbox/meshbox/appliance/localnats"
	"github.com/meshbox/meshbox/appliance/modules"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/node"
	"github.com/nats-io/nats.go"
)

// running holds the parts of a started appliance, in the order Start
// starts them. A value is never changed once published: Start and Close
// (a.mu held) publish a copy with a part added or taken away (update),
// and everyone else reads the one published (parts) without a lock. A
// part is published once it runs and taken away before Close stops it.
type running struct {
	startedAt time.Time // when Start began (the node's StartedAt in its mesh view)
	httpURL   string    // the status endpoints' base URL ("" when off); kept after Close
	http      *http.Server
	bindings  *bindings
	keys      *keys.Keeper // nil standalone (keys.go)
	nats      *localnats.Server
	nc        *nats.Conn // in-process connection for the node's own API
	// replies answers local clients on a connection that may publish on
	// _INBOX.> and nothing else. Opened after nc, closed after
	// everything that answers on it.
	replies  *localnats.Responder
	interest *interestWatcher // the one watcher of what local programs host
	blobs    *blobs.Server
	blobConn *nats.Conn
	rows     *rows.Engine // the node's tables of rows (rows.go)
	rowsConn *nats.Conn
	retained *retainedMirror // the MQTT retained state of the mesh (mqttretained.go)
	bridge   *bridge.Bridge
	node     *node.Node
	mods     *modules.Supervisor // supervises the assigned modules
	// linkUp is set when the bridge's link connects, and taken by whoever
	// tells the node: the bridge's callback, or startNode when the link
	// connected between the node's Start and its publication.
	linkUp *atomic.Bool
	// knownProtocol is the lowest discovery protocol of the nodes the
	// node knows of (node.Config.OnKnownProtocols; 0: one unknown): the
	// tables write snapshot parts in binary only when all read them.
	knownProtocol *atomic.Int32
}

// notRunning is what parts returns before Start. Never written.
var notRunning running

// parts returns the running parts published now (none before Start).
// The value must not be changed.
func (a *Appliance) parts() *running {
	if r := a.run.Load(); r != nil {
		return r
	}
	return &notRunning
}

// update publishes a copy of the running parts that f changed, and
// returns it. a.mu is held.
func (a *Appliance) update(f func(r *running)) *running {
	next := *a.parts()
	f(&next)
	a.run.Store(&next)
	return &next
}
