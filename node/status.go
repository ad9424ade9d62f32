package node

import (
	"time"

	"github.com/meshbox/meshbox/internal/wire"
)

// Peer states.
const (
	StateUp     = "up"                  // heard from within the heartbeat window
	StateGone   = "gone"                // left cleanly, missed too many heartbeats, or not connected to the broker
	StateAbsent = "expected-but-absent" // in the bindings' node records, never heard from
)

// Peer is one other node as this node sees it. Values are copies; they do
// not change after they are returned.
type Peer struct {
	Name  string `json:"name"`
	State string `json:"state"`
	// Expected says the bindings' node records list the peer.
	Expected bool `json:"expected"`
	// Since is when the peer entered its state.
	Since time.Time `json:"since"`
	// LastSeen is when the last message from the peer arrived (zero if
	// never).
	LastSeen time.Time `json:"last_seen,omitzero"`
	// Reason says why a gone peer is gone: "left", "missed N heartbeats"
	// or "not connected to the broker".
	Reason       string    `json:"reason,omitempty"`
	Version      string    `json:"version,omitempty"`
	StartedAt    time.Time `json:"started_at,omitzero"`
	Revision     int64     `json:"revision"`
	Capabilities []string  `json:"capabilities"`
	Stages       []string  `json:"stages"`
	// Signs says the peer's node record has a signing key: only messages
	// signed with it are accepted from the peer.
	Signs bool `json:"signs"`
	// Health is the peer's last health summary while it is up; nil when
	// it is not, or sent none (a node of an older version).
	Health *Health `json:"health,omitempty"`
}

// Capabilities is what is hosted where: the capabilities and stages local
// programs host, and for each one hosted by a live peer, the peers (sorted).
// Remote lists every live host, including capabilities that are also
// hosted locally (plain calls go to the local host; node.<node>.cap.<name>
// reaches the named one).
type Capabilities struct {
	Local        []string            `json:"local"`
	Remote       map[string][]string `json:"remote"`
	LocalStages  []string            `json:"local_stages"`
	RemoteStages map[string][]string `json:"remote_stages"`
}

// Status is the node's part of the appliance's status JSON.
type Status struct {
	Peers        []Peer       `json:"peers"`
	Capabilities Capabilities `json:"capabilities"`
}

// The node's own NATS API subjects, served when Config.Conn is set. Each
// answers any request with JSON: $MESH.peers with a PeersReply,
// $MESH.caps with a CapsReply.
const (
	SubjectPeers = wire.SubjectPeers
	SubjectCaps  = wire.SubjectCaps
)

// PeersReply is the answer to $MESH.peers.
type PeersReply struct {
	Node  string `json:"node"`
	Peers []Peer `json:"peers"`
}

// CapsReply is the answer to $MESH.caps.
type CapsReply struct {
	Node string `json:"node"`
	Capabilities
}
