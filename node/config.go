package node

import (
	"context"
	"log/slog"
	"math"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// Link is what the node needs from the bridge: a way to send discovery
// messages over the broker, and the two controls over the stand-ins. Its
// methods must be safe for concurrent use; the node calls SetRoutes and
// MarkGone from one goroutine, in the order the view changed.
type Link interface {
	// PublishSystem sends a system message with key key (the message
	// type, "hello" say) to every other node. It must not queue the
	// message for later (no outbox): discovery messages are worthless
	// once stale, and the node learns from a prompt error that the broker
	// is away. It must return by the context's deadline.
	PublishSystem(ctx context.Context, key string, body []byte) error
	// SendSystem sends a system message to node alone, on the same terms.
	// It fails when node is not connected.
	SendSystem(ctx context.Context, node, key string, body []byte) error
	// ProbeNode asks the broker whether node is still connected, with a
	// message that carries nothing (to.<node>.sys.probe: no body, no
	// properties, no confirm) and that the addressee's link drops unread.
	// It returns once the probe is written, and fails when the link is
	// not connected. When the broker returns the probe unroutable (node's
	// system queue, and with it its connection, is gone), the link calls
	// unroutable once, on a goroutine of its own, with none of its locks
	// held; a probe that was routed is never heard of again.
	ProbeNode(ctx context.Context, node string, unroutable func()) error
	// SetRoutes replaces the set of capabilities hosted elsewhere:
	// capability -> the live nodes hosting it (sorted). A capability that
	// is hosted locally is never in it. The bridge keeps a stand-in on
	// cap.<name> for each key and spreads calls over the listed nodes.
	SetRoutes(routes map[string][]string)
	// MarkGone says node is gone since the given time: calls addressed to
	// it fail at once, naming the node and the time. A zero since
	// withdraws the mark: the node is back (or forgotten).
	MarkGone(node string, since time.Time)
}

// Config configures a Node. Name and Link are required; zero durations
// take their defaults.
type Config struct {
	// Name is this node's mesh name.
	Name string
	// Version is the meshbox version the node advertises.
	Version string
	// StartedAt is when the node started; zero means the time of New.
	// Peers tell a restart from a late message by it.
	StartedAt time.Time

	// Link publishes discovery messages and controls the stand-ins.
	Link Link
	// Signer, when set, signs every discovery message the node sends
	// with the node's signing key, whose public half its node record
	// publishes (see "Signed discovery" in doc.go). Unset, the node's
	// messages are not signed: its peers accept that only while its
	// record has no signing key.
	Signer Signer
	// Conn, when set, is an in-process connection to the node's NATS
	// server on which the node serves $MESH.peers and $MESH.caps.
	Conn *nats.Conn
	// Replies, when set, is the connection the node answers on there (the
	// node's responder, which may publish on inboxes only); nil: Conn.
	Replies *nats.Conn
	// OnLocalChange, when set, is called with the sorted capabilities and
	// stages hosted locally each time they change (first after Start). It
	// runs on the node's effects goroutine and must not block for long.
	OnLocalChange func(capabilities, stages []string)
	// OnPeerProtocols, when set, is called with the lowest protocol
	// version the up peers speak (ProtocolVersion when there are none)
	// each time it changes, on the effects goroutine: first once the
	// node's first discovery message has been out for PeerProtocolSettle,
	// so that the peers' answers to its hello are in. The bridge sends
	// command batches only while it is at least 3.
	OnPeerProtocols func(oldest int)
	// OnEventPeers, when set, is called on the effects goroutine with the
	// sorted names of the nodes this one knows of (expected by the
	// bindings or heard, up or not) each time they change, and with
	// legacy: some of them has not been heard speaking
	// EventLaneProtocolVersion or later since this node started, so it
	// may publish its events without a lane (the bridge then binds the
	// shared event keys too). First after Start.
	OnEventPeers func(peers []string, legacy bool)
	// OnKnownProtocols, when set, is called on the effects goroutine with
	// the lowest protocol version of the nodes this one knows of
	// (expected by the bindings or heard, up or not): 0 while one of them
	// has not been heard since this node started, and without node
	// records (a mesh without a database), which leave every node
	// unknown. Each time it changes, first after Start.
	OnKnownProtocols func(oldest int)
	// OnEventListeners, when set, is called on the effects goroutine with
	// what the other nodes listen to (see Listeners) each time it changes,
	// first after Start. The bridge sends an event to the broker only when
	// some other node listens to its topic.
	OnEventListeners func(*Listeners)

	// DiscoveryInterval is how often the node probes its successors on
	// the ring of peers, asking the broker whether they are still
	// connected (default 5s, jittered). A peer whose connection closed is
	// noticed within about this interval.
	DiscoveryInterval time.Duration
	// HeartbeatInterval is how often the node broadcasts that it is alive
	// while the mesh has up to 10 nodes (default 5m); beyond, the interval
	// grows with the mesh (HeartbeatIntervalFor). Heartbeats carry the
	// hash of the node's record, which heals a lost update, and notice a
	// peer that hangs with its broker connection open; the probes notice
	// a peer whose connection is gone.
	HeartbeatInterval time.Duration
	// HeartbeatBudget is the broker deliveries per second the broadcast
	// heartbeats of the whole mesh may cost (default 5000). Once the mesh
	// is large enough for HeartbeatInterval to exceed it, the interval
	// grows with the square of the mesh size (HeartbeatIntervalFor).
	HeartbeatBudget float64
	// NoRoute, when set, reports whether an error of Link.SendSystem
	// means the broker had no route to the addressee (it is not
	// connected). Without it, only silence makes a peer gone.
	NoRoute func(error) bool
	// Connected, when set, reports whether the link is connected to the
	// broker now. When a broadcast failed and the link is not connected,
	// the node sends nothing more (no heartbeat, no probe) until LinkUp,
	// which the link's owner must then call each time the link connects:
	// an idle node without a broker (standalone, or its broker away) does
	// not wake to fail a publish. Unset, or when the link is connected,
	// the node tries again at its next heartbeat.
	Connected func() bool
	// MissedHeartbeats is how many heartbeat intervals a peer may stay
	// silent before it is marked gone (default 3).
	MissedHeartbeats int
	// PublishTimeout bounds one discovery publish (default 2s, at most
	// HeartbeatInterval).
	PublishTimeout time.Duration
	// GoneRetention is how long a gone peer that is not expected stays in
	// the view (default 24h).
	GoneRetention time.Duration

	// Logger receives the node's logs; nil means none.
	Logger *slog.Logger
	// Registerer receives the node's metrics; nil means they are not
	// registered.
	Registerer prometheus.Registerer
}

// Default values of Config.
const (
	DefaultDiscoveryInterval = 5 * time.Second
	DefaultHeartbeatInterval = 5 * time.Minute
	DefaultMissedHeartbeats  = 3
	DefaultHeartbeatBudget   = 5000
	DefaultPublishTimeout    = 2 * time.Second
	DefaultGoneRetention     = 24 * time.Hour
	maxPeers                 = 4096
	byeTimeout               = time.Second
)

// withDefaults fills zero fields and validates; errors name the field.
func (c Config) withDefaults() (Config, error) {
	if !ValidNodeName(c.Name) {
		return c, &ConfigError{Field: "Name", Msg: "not a valid node name (letters, digits, '-', '_'; 1 to 64)"}
	}
	if c.Link == nil {
		return c, &ConfigError{Field: "Link", Msg: "required"}
	}
	if len(c.Version) > MaxVersionLen || !printable(c.Version) {
		return c, &ConfigError{Field: "Version", Msg: "not printable or too long"}
	}
	defaults := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"DiscoveryInterval", &c.DiscoveryInterval, DefaultDiscoveryInterval},
		{"HeartbeatInterval", &c.HeartbeatInterval, DefaultHeartbeatInterval},
		{"PublishTimeout", &c.PublishTimeout, DefaultPublishTimeout},
		{"GoneRetention", &c.GoneRetention, DefaultGoneRetention},
	}
	for _, d := range defaults {
		if *d.v < 0 {
			return c, &ConfigError{Field: d.name, Msg: "must not be negative"}
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.HeartbeatInterval < minHeartbeatMS*time.Millisecond || c.HeartbeatInterval > maxHeartbeatMS*time.Millisecond {
		return c, &ConfigError{Field: "HeartbeatInterval", Msg: "out of range 10ms..1h"}
	}
	if c.MissedHeartbeats < 0 || c.MissedHeartbeats > 100 {
		return c, &ConfigError{Field: "MissedHeartbeats", Msg: "out of range 1..100"}
	}
	if c.HeartbeatBudget < 0 || math.IsNaN(c.HeartbeatBudget) || math.IsInf(c.HeartbeatBudget, 0) {
		return c, &ConfigError{Field: "HeartbeatBudget", Msg: "must be a positive number of deliveries per second"}
	}
	if c.HeartbeatBudget == 0 {
		c.HeartbeatBudget = DefaultHeartbeatBudget
	}
	if c.MissedHeartbeats == 0 {
		c.MissedHeartbeats = DefaultMissedHeartbeats
	}
	c.PublishTimeout = min(c.PublishTimeout, c.HeartbeatInterval)
	if c.StartedAt.IsZero() {
		c.StartedAt = time.Now()
	}
	c.StartedAt = c.StartedAt.UTC()
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}
