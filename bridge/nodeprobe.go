package bridge

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/internal/wire"
)

// Probes: the cheapest question the broker answers about another node,
// whether it is still connected. A node's system queue is exclusive to
// its consuming connection, so the broker has no route to
// to.<n>.sys.<key> once that connection is gone. A probe is a message to
// that key (wire.ProbeKey) with no body and no properties, published
// mandatory on the request channel, which has no confirms: a routed
// probe costs a publish frame and an empty content header on the way up,
// the addressee a deliver frame and the header on the way down (its
// bridge drops it unread), and nothing comes back; one the broker cannot
// route comes back as a basic.return, which calls the prober's
// unroutable. Discovery (package node) probes its ring neighbours with
// them when they speak discovery protocol 5 or later.

// probeReturnWait is how long a probe waits for the broker's return. The
// broker returns an unroutable message at once, so a return comes within
// a round trip of the publish; a probe older than this was routed.
const probeReturnWait = 10 * time.Second

// ProbeNode asks the broker whether node is connected (see above). It
// returns once the probe is written; unroutable is called, once, from the
// goroutine that reads the request channel's returns, if the broker
// returns it. It fails with ErrLinkDown while the link is not connected
// and with ErrBadInput for an invalid node name.
func (b *Bridge) ProbeNode(ctx context.Context, node string, unroutable func()) error {
	if !codec.ValidNodeName(node) || unroutable == nil {
		return fmt.Errorf("probe node: %w: node %q", codec.ErrBadInput, node)
	}
	sess := b.link.sess.Load()
	if st, _ := b.linkState(); st != StateConnected || sess == nil {
		return ErrLinkDown
	}
	w := b.peers.probes.add(node, unroutable)
	out := &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: probeKey(node), Mandatory: true, Kind: codec.TypeSystem, Bare: true}
	res := make(chan error, 1)
	if err := sess.enqueueFast(&pubItem{Out: out, Done: func(err error) { res <- err }}); err != nil {
		b.peers.probes.remove(node, w)
		return fmt.Errorf("probe node %s: %w", node, err)
	}
	select {
	case err := <-res:
		if err != nil {
			b.peers.probes.remove(node, w)
			return fmt.Errorf("probe node %s: %w", node, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err() // it may still go out; a return then finds it
	}
}

// probeKey is the routing key of a probe of node n.
func probeKey(n string) string { return codec.AddressedSystemKey(n, wire.ProbeKey) }

// probedNode returns the node a returned message with routing key key
// probed, if it is a probe.
func probedNode(key string) (string, bool) {
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

// probeReturned handles a probe of node the broker returned: the oldest
// probe of node still waiting is unroutable. A return with no probe
// waiting (later than probeReturnWait) is dropped.
func (b *Bridge) probeReturned(node string) {
	b.m.err(errKindNoRoute)
	if w, ok := b.peers.probes.take(node); ok {
		w.unroutable()
	}
}

// add records a probe of node written now, and drops the probes that
// waited longer than probeReturnWait.
func (pb *probeBook) add(node string, unroutable func()) *waitingProbe {
	now := time.Now()
	w := &waitingProbe{at: now, unroutable: unroutable}
	pb.mu.Lock()
	defer pb.mu.Unlock()
	if pb.waiting == nil {
		pb.waiting = map[string][]*waitingProbe{}
	}
	if now.Sub(pb.lastSweep) > probeReturnWait {
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
// probeReturnWait (pb.mu held).
func (pb *probeBook) expireLocked(node string, now time.Time) {
	ws := pb.waiting[node]
	i := 0
	for i < len(ws) && now.Sub(ws[i].at) > probeReturnWait {
		i++
	}
	if i == len(ws) {
		delete(pb.waiting, node)
		return
	}
	pb.waiting[node] = ws[i:]
}

// take removes and returns the oldest probe of node still waiting.
func (pb *probeBook) take(node string) (*waitingProbe, bool) {
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
	return ws[0], true
}

// remove drops probe w of node (it was not written).
func (pb *probeBook) remove(node string, w *waitingProbe) {
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
