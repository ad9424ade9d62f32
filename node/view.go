package node

import (
	"slices"
	"time"
)

// The views of the mesh handed out: peers, capabilities, routes.

func (n *Node) peersLocked() []Peer {
	out := make([]Peer, 0, len(n.peers))
	keys := n.signingKeys()
	for _, p := range n.peers {
		pp := Peer{
			Name:         p.name,
			State:        p.state,
			Expected:     p.expected,
			Since:        p.since.UTC(),
			LastSeen:     p.lastSeen.UTC(),
			Reason:       p.reason,
			Version:      p.version,
			StartedAt:    p.startedAt,
			Revision:     p.revision,
			Capabilities: slices.Clone(p.record.caps),
			Stages:       slices.Clone(p.record.stages),
		}
		_, pp.Signs = keys[p.name]
		if p.health != nil && p.state == StateUp { // a gone peer's summary is stale
			h := *p.health
			h.Failing = slices.Clone(h.Failing)
			pp.Health = &h
		}
		if pp.Capabilities == nil {
			pp.Capabilities = []string{}
		}
		if pp.Stages == nil {
			pp.Stages = []string{}
		}
		out = append(out, pp)
	}
	slices.SortFunc(out, func(a, b Peer) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

func (n *Node) capabilitiesLocked() Capabilities {
	c := Capabilities{
		Local:        slices.Clone(n.local.caps),
		LocalStages:  slices.Clone(n.local.stages),
		Remote:       map[string][]string{},
		RemoteStages: map[string][]string{},
	}
	if c.Local == nil {
		c.Local = []string{}
	}
	if c.LocalStages == nil {
		c.LocalStages = []string{}
	}
	for _, p := range n.livePeersLocked() {
		for _, name := range p.record.caps {
			c.Remote[name] = append(c.Remote[name], p.name)
		}
		for _, name := range p.record.stages {
			c.RemoteStages[name] = append(c.RemoteStages[name], p.name)
		}
	}
	return c
}

// routesLocked is what SetRoutes gets: remote hosts of every capability
// that is not hosted locally.
func (n *Node) routesLocked() map[string][]string {
	routes := map[string][]string{}
	for _, p := range n.livePeersLocked() {
		for _, name := range p.record.caps {
			if _, local := slices.BinarySearch(n.local.caps, name); !local {
				routes[name] = append(routes[name], p.name)
			}
		}
	}
	return routes
}

// livePeersLocked returns the up peers whose record is known, by name.
func (n *Node) livePeersLocked() []*peer {
	var out []*peer
	for _, p := range n.peers {
		if p.state == StateUp && p.hasRecord {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *peer) int {
		switch {
		case a.name < b.name:
			return -1
		case a.name > b.name:
			return 1
		}
		return 0
	})
	return out
}

// goneLocked returns the gone peers with the time they were last seen.
func (n *Node) goneLocked() map[string]time.Time {
	gone := map[string]time.Time{}
	for _, p := range n.peers {
		if p.state == StateGone {
			gone[p.name] = p.lastSeen
			if p.lastSeen.IsZero() {
				gone[p.name] = p.since
			}
		}
	}
	return gone
}
