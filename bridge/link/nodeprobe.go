package link

import (
	"strings"
	"sync"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"
	"github.com/meshbox/meshbox/internal/wire"
)

// This file holds the probes of other nodes: a message to a node's
// system queue the broker returns when that node is not connected (the
// bridge's nodeprobe.go sends them).

// ProbeReturnWait is how long a probe waits for the broker's return. The
// broker returns an unroutable message at once, so a return comes within
// a round trip of the publish; a probe older than this was routed.
const ProbeReturnWait = 10 * time.Second

// NodeProbes holds the probes of other nodes that wait for the broker's
// "no route": by addressee, oldest first. mu guards them; the zero value
// is ready.
type NodeProbes struct {
	mu        sync.Mutex
	waiting   map[string][]*WaitingProbe
	lastSweep time.Time // when every addressee's expired probes were last dropped
}

// WaitingProbe is one probe written at at, and what to call when the
// broker returns it (Add, Remove).
type WaitingProbe struct {
	at         time.Time
	unroutable func()
}

// ProbeKey is the routing key of a probe of node n.
func ProbeKey(n string) string { return codec.AddressedSystemKey(n, wire.ProbeKey) }

// ProbedNode returns the node a returned message with routing key key
// probed, if it is a probe.
func ProbedNode(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, "to.")
	if !ok {
		return "", false
	}
	node, ok := strings.CutSuffix(rest, ".sys."+wire.ProbeKey)
	if !ok || !codec.ValidNodeName(node) {
		return "", false
	}
	return node, true
}

// Add records a probe of node written now, and drops the probes that
// waited longer than ProbeReturnWait.
func (pb *NodeProbes) Add(node string, unroutable func()) *WaitingProbe {
	now := time.Now()
	w := &WaitingProbe{at: now, unroutable: unroutable}
	pb.mu.Lock()
	defer pb.mu.Unlock()
	if pb.waiting == nil {
		pb.waiting = map[string][]*WaitingProbe{}
	}
	if now.Sub(pb.lastSweep) > ProbeReturnWait {
		pb.lastSweep = now
		for n := range pb.waiting {
			pb.expireLocked(n, now)
		}
	}
	pb.expireLocked(node, now)
	pb.waiting[node] = append(pb.waiting[node], w)
	return w
}

// expireLocked drops node's probes that waited longer than
// ProbeReturnWait (pb.mu held).
func (pb *NodeProbes) expireLocked(node string, now time.Time) {
	ws := pb.waiting[node]
	i := 0
	for i < len(ws) && now.Sub(ws[i].at) > ProbeReturnWait {
		i++
	}
	if i == len(ws) {
		delete(pb.waiting, node)
		return
	}
	pb.waiting[node] = ws[i:]
}

// Take removes the oldest probe of node still waiting and returns its
// unroutable.
func (pb *NodeProbes) Take(node string) (unroutable func(), ok bool) {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	pb.expireLocked(node, time.Now())
	ws := pb.waiting[node]
	if len(ws) == 0 {
		return nil, false
	}
	if len(ws) == 1 {
		delete(pb.waiting, node)
	} else {
		pb.waiting[node] = ws[1:]
	}
	return ws[0].unroutable, true
}

// Remove drops probe w of node (it was not written).
func (pb *NodeProbes) Remove(node string, w *WaitingProbe) {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	ws := pb.waiting[node]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(pb.waiting, node)
		return
	}
	pb.waiting[node] = ws
}
