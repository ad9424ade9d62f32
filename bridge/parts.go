package bridge

import (
	"sync"
	"sync/atomic"
	"time"

	brokerlink "github.com/meshbox/meshbox/bridge/link"
	"github.com/meshbox/meshbox/internal/causelog"

	"github.com/meshbox/meshbox/bridge/completed"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/bridge/outbox"
)

// This file holds the parts a Bridge's state is cut into (see Bridge):
// each part is a struct of its own, and a mutex in it guards only its
// own fields. The code that uses a part lives in the file its comment
// names.

// stores are the bridge's files.
type stores struct {
	ob *outbox.Outbox
	// obRef is ob for Status, which may run while Start is still working.
	obRef atomic.Pointer[outbox.Outbox]
	// done is the store of completed message ids (nil: no stage dedupes).
	done *completed.Store
}

// lifecycle is whether the bridge started and closed, and its
// subscriptions on the local NATS server.
type lifecycle struct {
	mu        sync.Mutex // guards started, closed, subs
	started   bool
	closed    bool
	subs      []*nats.Subscription
	closeOnce sync.Once
	closeErr  error
	bcClosed  chan struct{} // closed when bc is closed
}

// requestBook holds the requests and calls that outlive a session.
type requestBook struct {
	pending pendingRequests // requests waiting for a reply from another node
	returns returnedReplies // replies the broker returned, sent again (noroute.go)
	// answered is when each node last answered a request of this node
	// (*atomic.Int64, Unix nanoseconds, by node name; noroute.go).
	answered sync.Map
	// local counts local calls for node.<self>.cap.<name>, each ends at
	// its deadline.
	local sync.WaitGroup

	orphanMu sync.Mutex  // guards orphans
	orphans  []*hostCall // calls from other nodes an ended session had open (hostcalls.go)
}

// commandBook holds what the bridge knows of commands across sessions.
type commandBook struct {
	// local are the commands at local handlers outside a session
	// (lease.go): *localCmd keys.
	local  sync.Map
	handed *codec.HandedOut // ids of commands handed to local handlers, across sessions
	stall  stallBook        // stall alarms of command stages
	dead   deadBook         // dead letters per stage at the last look (deadletters.go)
	// deadLogged counts the dead letters of the process's life, for
	// logging them sparingly (logDead).
	deadLogged atomic.Uint64
	// batching: every peer reads command batches (SetCommandBatching).
	batching atomic.Bool
	// orderKeys: every peer keeps commands in order by key
	// (SetOrderKeys).
	orderKeys atomic.Bool
}

// peerBook is what the node knows of other nodes: their broker users,
// and the probes of them that wait for the broker's answer.
type peerBook struct {
	// creds are the broker users other nodes' system messages came with
	// (bridge/link's credential.go).
	creds brokerlink.PeerCredentials
	// senders are the credential generations accepted per node
	// (senders.go).
	senders senders
	// probes are the probes of other nodes waiting for a "no route"
	// (nodeprobe.go).
	probes brokerlink.NodeProbes
}

// refusalLogs are the causes of refusals already logged, each said once.
type refusalLogs struct {
	replay causelog.Log // refused replays (replay.go)
	forged causelog.Log // forged deliveries (senders.go)
	unseal causelog.Log // refused sealed messages (sealing.go)
	local  causelog.Log // refused local messages (localclients.go)
}

// routing is where capabilities are hosted and what this node hosts.
type routing struct {
	mu        sync.RWMutex
	routes    map[string][]string  // capability -> nodes hosting it
	gone      map[string]time.Time // node -> since when discovery marks it gone
	rr        atomic.Uint64        // round robin among hosts
	hosted    map[string]bool      // stages hosted here
	declared  map[string]bool      // stages assigned modules declare (queues declared, not consumed)
	localCaps map[string]bool      // capabilities hosted by local programs
	standins  map[string]*nats.Subscription
	changed   chan struct{} // cap 1: routes or local capabilities changed
	// stagesChanged (cap 1): the consumer manager of the session re-syncs.
	stagesChanged chan struct{}
	// credits (under mu): the credit (messages) each stage's last
	// session wanted last; the next session starts from it.
	credits map[string]int
	// grants: the stages the mesh allows this node, and those the broker
	// refuses it (its own mutex).
	grants stageGrants
}

// stageGrants is what the bridge knows of this node's right to consume
// stages (grants.go): the stage allow-list of its bindings, and the
// hosted stages the broker refuses it. mu guards known, allowed, refused.
type stageGrants struct {
	mu      sync.Mutex
	known   bool              // SetAllowedStages gave an allow-list
	allowed []string          // the allow-list, sorted (wire.AllStages: every stage)
	refused map[string]string // hosted stage -> why no session consumes it
}

// creditOf returns the credit stage's last session wanted (0: none).
func (r *routing) creditOf(stage string) int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.credits[stage]
}

// keepCredit records the credit stage's session wants now.
func (r *routing) keepCredit(stage string, msgs int) {
	r.mu.Lock()
	r.credits[stage] = msgs
	r.mu.Unlock()
}
