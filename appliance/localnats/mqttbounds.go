package localnats

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/meshbox/meshbox/appliance/programs"
)

// Causes of a refusal of the MQTT door, as the node counts them
// (MQTTRefusals) under the program whose device was refused.
const (
	RefusedRetainedMsgs  = "retained_msgs"  // a retain past the program's count of retained messages
	RefusedRetainedBytes = "retained_bytes" // a retain past the program's bytes of retained messages
	RefusedInflight      = "inflight"       // a QoS 2 publish past the program's unreleased ones
	RefusedSessions      = "sessions"       // a new client ID past the program's sessions
	RefusedClientID      = "client_id"      // a client ID another program holds
)

// Anonymous is the name the door keeps the state of clients without a
// credential under (an open node's).
const Anonymous = "(anonymous)"

// mqttBounds is what each MQTT program's devices keep in the server's
// store, as the door (mqttdoor.go) let it in: the sessions (client IDs)
// each holds, the QoS 2 publishes each session has not released, and
// the retained messages each program's devices stored. The door asks it
// before it passes a CONNECT or a PUBLISH; the retained messages the
// node's server stores are heard too (heardRetained), so that a topic
// another node's retain or another device took is no longer charged.
// Its methods are safe for concurrent use.
type mqttBounds struct {
	path string // the stored sessions' owners, kept across restarts
	log  *slog.Logger

	mu       sync.Mutex
	sessions map[string]*mqttSession // by client ID
	retained map[string]retainedHold // by MQTT topic
	refused  map[string]map[string]uint64
}

// mqttSession is one client ID's: the program that holds it, whether
// the server keeps it after its connection ends (clean session off), the
// door's connection that uses it now (nil: none), and its QoS 2
// publishes not yet released.
type mqttSession struct {
	program    string
	persistent bool
	conn       *doorConn
	held       map[uint16]struct{}
}

// retainedHold is the retained message of one topic a program's device
// stored: its program and payload size.
type retainedHold struct {
	program string
	size    int64
}

// mqttSessionsFile keeps, in the data directory, which program holds each
// stored session's client ID.
const mqttSessionsFile = "mqtt-sessions.json"

func newMQTTBounds(dataDir string, log *slog.Logger) *mqttBounds {
	b := &mqttBounds{path: filepath.Join(dataDir, mqttSessionsFile), log: log,
		sessions: map[string]*mqttSession{}, retained: map[string]retainedHold{},
		refused: map[string]map[string]uint64{}}
	data, err := os.ReadFile(b.path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			log.Warn("MQTT sessions' owners not read: the first program to use a stored session's client ID takes it", "err", err)
		}
		return b
	}
	var owners map[string]string
	if err := json.Unmarshal(data, &owners); err != nil {
		log.Warn("MQTT sessions' owners not read: the first program to use a stored session's client ID takes it", "file", b.path, "err", err)
		return b
	}
	for id, prog := range owners {
		b.sessions[id] = &mqttSession{program: prog, persistent: true}
	}
	return b
}

// saveLocked writes the stored sessions' owners; b.mu is held.
func (b *mqttBounds) saveLocked() {
	owners := map[string]string{}
	for id, s := range b.sessions {
		if s.persistent {
			owners[id] = s.program
		}
	}
	data, _ := json.Marshal(owners) // strings: cannot fail
	tmp := b.path + ".tmp"
	err := os.WriteFile(tmp, data, 0o600)
	if err == nil {
		err = os.Rename(tmp, b.path)
	}
	if err != nil {
		b.log.Warn("MQTT sessions' owners not written", "err", err)
	}
}

// refuse counts a refusal of program's device for cause, and logs the
// first of each program and cause.
func (b *mqttBounds) refuse(program, cause, detail string) {
	b.mu.Lock()
	m := b.refused[program]
	if m == nil {
		m = map[string]uint64{}
		b.refused[program] = m
	}
	m[cause]++
	first := m[cause] == 1
	b.mu.Unlock()
	if first {
		b.log.Warn("MQTT device refused past its program's limit (logged once per program and cause; counted in meshbox_mqtt_refused_total)",
			"program", program, "cause", cause, "detail", detail)
	}
}

// programCount is how many sessions program holds; b.mu is held.
func (b *mqttBounds) programCount(program string) int {
	n := 0
	for _, s := range b.sessions {
		if s.program == program {
			n++
		}
	}
	return n
}

// claim gives client ID id to program's connection c, or says why not:
// RefusedClientID when another program holds it, RefusedSessions when
// program holds its limit of sessions already. known reports whether a
// program is still one of the node's: a session of a program removed
// since is free.
func (b *mqttBounds) claim(program, id string, persistent bool, c *doorConn, lim programs.MQTTLimits, known func(string) bool) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sessions[id]
	if s != nil && s.program != program && known(s.program) {
		return RefusedClientID
	}
	if s == nil || s.program != program {
		if b.programCount(program) >= lim.Sessions {
			return RefusedSessions
		}
		s = &mqttSession{program: program}
		b.sessions[id] = s
	}
	was := s.persistent
	s.persistent, s.conn = persistent, c
	if persistent || was {
		b.saveLocked()
	}
	return ""
}

// release ends c's use of client ID id: a clean session ends with its
// connection (the server drops it), a stored one stays the program's.
func (b *mqttBounds) release(id string, c *doorConn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.sessions[id]; s != nil && s.conn == c {
		s.conn = nil
		if !s.persistent {
			delete(b.sessions, id)
		}
	}
}

// inflightLocked is how many QoS 2 publishes program's sessions hold;
// b.mu is held.
func (b *mqttBounds) inflightLocked(program string) int {
	n := 0
	for _, s := range b.sessions {
		if s.program == program {
			n += len(s.held)
		}
	}
	return n
}

// holdQoS2 notes that session id started QoS 2 publish pi, or reports
// false when its program holds its limit already (a resent one is no
// new one).
func (b *mqttBounds) holdQoS2(id string, pi uint16, lim programs.MQTTLimits) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sessions[id]
	if s == nil {
		return true
	}
	if _, ok := s.held[pi]; ok {
		return true
	}
	if b.inflightLocked(s.program) >= lim.Inflight {
		return false
	}
	if s.held == nil {
		s.held = map[uint16]struct{}{}
	}
	s.held[pi] = struct{}{}
	return true
}

// releaseQoS2 notes that session id released QoS 2 publish pi.
func (b *mqttBounds) releaseQoS2(id string, pi uint16) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.sessions[id]; s != nil {
		delete(s.held, pi)
	}
}

// retain reports whether program's device may retain size bytes on
// topic, and charges it when it may; "" or the cause when not. An empty
// payload clears the topic: always allowed.
func (b *mqttBounds) retain(program, topic string, size int64, lim programs.MQTTLimits) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if size == 0 {
		delete(b.retained, topic)
		return ""
	}
	n, bytes := 0, int64(0)
	for t, h := range b.retained {
		if h.program == program && t != topic {
			n++
			bytes += h.size
		}
	}
	switch {
	case n+1 > lim.RetainedMsgs:
		return RefusedRetainedMsgs
	case bytes+size > lim.RetainedBytes:
		return RefusedRetainedBytes
	}
	b.retained[topic] = retainedHold{program: program, size: size}
	return ""
}

// heardRetained notes a retained message the server stored on topic: a
// device's of program (as the door charged it), or another node's
// (mesh: MeshOrigin), which no local program is charged for.
func (b *mqttBounds) heardRetained(topic, program string, size int64, mesh bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if mesh || size == 0 {
		delete(b.retained, topic)
		return
	}
	if program == "" {
		program = Anonymous
	}
	b.retained[topic] = retainedHold{program: program, size: size}
}

// MQTTProgramState is what one program's devices keep in the node's MQTT
// store, and how often the door refused them.
type MQTTProgramState struct {
	Program  string              `json:"program"`
	Limits   programs.MQTTLimits `json:"limits"`
	Retained []MQTTRetainedTopic `json:"retained"`
	// RetainedBytes is the payload of its retained messages, together.
	RetainedBytes int64              `json:"retained_bytes"`
	Sessions      []MQTTSessionState `json:"sessions"`
	Refused       map[string]uint64  `json:"refused,omitempty"`
}

// MQTTRetainedTopic is one retained message of a program's device.
type MQTTRetainedTopic struct {
	Topic string `json:"topic"`
	Bytes int64  `json:"bytes"`
}

// MQTTSessionState is one session (client ID) of a program.
type MQTTSessionState struct {
	ClientID  string `json:"client_id"`
	Connected bool   `json:"connected"`
	// Stored: the server keeps it after its connection ends (clean
	// session off).
	Stored   bool `json:"stored"`
	Inflight int  `json:"inflight"` // QoS 2 publishes not yet released
}

// state is program's state.
func (b *mqttBounds) state(program string, lim programs.MQTTLimits) MQTTProgramState {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := MQTTProgramState{Program: program, Limits: lim, Retained: []MQTTRetainedTopic{}, Sessions: []MQTTSessionState{}}
	for t, h := range b.retained {
		if h.program == program {
			st.Retained = append(st.Retained, MQTTRetainedTopic{Topic: t, Bytes: h.size})
			st.RetainedBytes += h.size
		}
	}
	for id, s := range b.sessions {
		if s.program == program && !strings.HasPrefix(id, anonymousIDPrefix) {
			st.Sessions = append(st.Sessions, MQTTSessionState{ClientID: id, Connected: s.conn != nil, Stored: s.persistent, Inflight: len(s.held)})
		}
	}
	slices.SortFunc(st.Retained, func(a, b MQTTRetainedTopic) int { return strings.Compare(a.Topic, b.Topic) })
	slices.SortFunc(st.Sessions, func(a, b MQTTSessionState) int { return strings.Compare(a.ClientID, b.ClientID) })
	if r := b.refused[program]; len(r) > 0 {
		st.Refused = map[string]uint64{}
		for k, v := range r {
			st.Refused[k] = v
		}
	}
	return st
}

// forget drops client ID id of program (its session cleared).
func (b *mqttBounds) forget(program, id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.sessions[id]; s != nil && s.program == program {
		delete(b.sessions, id)
		if s.persistent {
			b.saveLocked()
		}
	}
}

// refusals is a copy of the refusals' counts, by program and cause.
func (b *mqttBounds) refusals() map[string]map[string]uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]map[string]uint64, len(b.refused))
	for p, m := range b.refused {
		c := make(map[string]uint64, len(m))
		for k, v := range m {
			c[k] = v
		}
		out[p] = c
	}
	return out
}

// anonymousIDPrefix starts the keys the door gives sessions of clients
// that sent no client ID (the server makes one up): no client ID starts
// with a NUL.
const anonymousIDPrefix = "\x00"

func anonymousID(n uint64) string { return fmt.Sprintf("%s%d", anonymousIDPrefix, n) }

// disconnect closes the connection that uses program's client ID id.
func (b *mqttBounds) disconnect(program, id string) {
	b.mu.Lock()
	var c *doorConn
	if s := b.sessions[id]; s != nil && s.program == program {
		c = s.conn
	}
	b.mu.Unlock()
	if c != nil {
		c.close()
	}
}
