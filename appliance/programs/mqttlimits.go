package programs

import (
	"fmt"
)

// MQTTLimits bound what one MQTT program's devices may keep in the node's
// MQTT store, all its devices together: the node's MQTT door (package
// localnats) holds them to it. A zero field takes its default
// (DefaultMQTTLimits).
type MQTTLimits struct {
	// RetainedMsgs and RetainedBytes bound the retained messages (topics,
	// and their payload bytes) the program's devices keep in the store;
	// past either, a retained publish is delivered to the subscribers
	// there are but not kept.
	RetainedMsgs  int   `json:"retained_msgs,omitempty"`
	RetainedBytes int64 `json:"retained_bytes,omitempty"`
	// Inflight bounds the QoS 2 publishes the program's devices have
	// started and not yet released (PUBREL), which the server holds in
	// the store; past it the publish is refused and its connection
	// closed.
	Inflight int `json:"inflight,omitempty"`
	// Sessions bounds the MQTT sessions (client IDs) the program holds:
	// its connected devices and the sessions its devices left stored
	// (clean session off); past it a device with a new client ID is
	// refused at CONNECT.
	Sessions int `json:"sessions,omitempty"`
}

// DefaultMQTTLimits are a program's MQTT limits where its definition
// gives none: room for a home's devices (a Zigbee2MQTT bridge retains a
// few hundred discovery messages of a few KiB), small beside the store.
var DefaultMQTTLimits = MQTTLimits{
	RetainedMsgs:  1000,
	RetainedBytes: 4 << 20,
	Inflight:      64,
	Sessions:      16,
}

// Upper bounds of a program's MQTT limits: one program's devices never
// take more than this of the node's store, whatever its definition says.
const (
	maxMQTTRetainedMsgs  = 100_000
	maxMQTTRetainedBytes = 64 << 20
	maxMQTTInflight      = 65_535 // MQTT's packet identifiers
	maxMQTTSessions      = 10_000
)

// Effective is l with each zero field at its default.
func (l MQTTLimits) Effective() MQTTLimits {
	d := DefaultMQTTLimits
	if l.RetainedMsgs > 0 {
		d.RetainedMsgs = l.RetainedMsgs
	}
	if l.RetainedBytes > 0 {
		d.RetainedBytes = l.RetainedBytes
	}
	if l.Inflight > 0 {
		d.Inflight = l.Inflight
	}
	if l.Sessions > 0 {
		d.Sessions = l.Sessions
	}
	return d
}

// validate checks that no limit is negative or past its upper bound.
func (l MQTTLimits) validate() error {
	for _, f := range []struct {
		flag     string
		v, upper int64
	}{
		{"mqtt-retained-msgs", int64(l.RetainedMsgs), maxMQTTRetainedMsgs},
		{"mqtt-retained", l.RetainedBytes, maxMQTTRetainedBytes},
		{"mqtt-inflight", int64(l.Inflight), maxMQTTInflight},
		{"mqtt-sessions", int64(l.Sessions), maxMQTTSessions},
	} {
		if f.v < 0 || f.v > f.upper {
			return fmt.Errorf("%s: %d is not within 0 (the default) and %d", f.flag, f.v, f.upper)
		}
	}
	return nil
}
