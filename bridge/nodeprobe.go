package bridge

import (
	"context"
	"fmt"

	brokerlink "github.com/meshbox/meshbox/bridge/link"

	"github.com/meshbox/meshbox/bridge/codec"
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
	if st, _ := b.link.Current(); st != StateConnected || sess == nil {
		return ErrLinkDown
	}
	w := b.peers.probes.Add(node, unroutable)
	out := &codec.Outgoing{Exchange: codec.ExchangeMesh, Key: brokerlink.ProbeKey(node), Mandatory: true, Kind: codec.TypeSystem, Bare: true}
	res := make(chan error, 1)
	if err := sess.enqueueFast(&pubItem{Out: out, Done: func(err error) { res <- err }}); err != nil {
		b.peers.probes.Remove(node, w)
		return fmt.Errorf("probe node %s: %w", node, err)
	}
	select {
	case err := <-res:
		if err != nil {
			b.peers.probes.Remove(node, w)
			return fmt.Errorf("probe node %s: %w", node, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err() // it may still go out; a return then finds it
	}
}

// probeReturned handles a probe of node the broker returned: the oldest
// probe of node still waiting is unroutable. A return with no probe
// waiting (later than link.ProbeReturnWait) is dropped.
func (b *Bridge) probeReturned(node string) {
	b.m.err(errKindNoRoute)
	if unroutable, ok := b.peers.probes.Take(node); ok {
		unroutable()
	}
}
