package localnats

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The MQTT door: the node's MQTT listener (nats_mqtt) is its own, in
// front of the server's, which listens on loopback only (and takes the
// door's own exchanges, and devices when the door cannot hand them over
// in this process: mqttpass.go). The server keys
// an MQTT session by its client ID alone and bounds nothing per user, so
// the door reads what a device sends and holds each program's devices to
// its limits (programs.MQTTLimits, kept in mqttBounds) before the server
// acts:
//
//   - CONNECT: it checks the device's password (the program's bcrypt
//     hash), then the client ID: one another program holds is refused
//     (identifier rejected), and so is a new one past the program's
//     sessions; the CONNECT it passes on carries the program's door
//     password, which only the door knows, so that no client reaches the
//     server's listener as a program around the door.
//   - PUBLISH: a retain past the program's retained messages is passed
//     on without its retain flag (subscribers get it, the store does not
//     keep it); a QoS 2 publish past the program's unreleased ones closes
//     the connection, unstored.
//   - PUBREL releases a QoS 2 publish.
//
// The door reads these as the server reads the device (doorReader),
// before the server sees them; what the server sends goes to the device
// as it comes. Each refusal is counted under the program and its cause
// (MQTTRefusals) and logged once.

// mqttDoorTimeout bounds the wait for a device's CONNECT, and the door's
// own exchanges with the server.
const mqttDoorTimeout = 10 * time.Second

// doorPasswordLen is the length of a program's door password (random
// bytes, hex).
const doorPasswordLen = 24

// doorReadBuffer is the size of the door's read buffer of a device: a
// packet's header the door reads (a PUBLISH's topic) fits in it, or is
// read apart.
const doorReadBuffer = 16 << 10

// mqttDoor is the node's MQTT listener. It owns a goroutine that accepts
// and one per connection until the server has it (in this process: the
// server's own goroutines read and write it from then on; over TCP: two
// per connection while it lasts); close closes every connection and
// returns once the door's goroutines have exited.
type mqttDoor struct {
	ln    net.Listener
	inner string // the server's MQTT listener, host:port on loopback
	// srv takes devices in this process (mqttpass.go); nil: the door
	// passes them to inner.
	srv    *server.Server
	auth   *localAuth
	bounds *mqttBounds
	log    *slog.Logger
	anonID atomic.Uint64
	// acceptErrs counts and logs the listener's failed accepts.
	acceptErrs *acceptErrors

	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[*doorConn]struct{}
	done  bool
	sub   *nats.Subscription
}

// doorConn is one device's connection through the door: dev the
// device's, srv the door's to the server once dialled (over TCP only).
// mu guards srv and closed.
type doorConn struct {
	dev    net.Conn
	mu     sync.Mutex
	srv    net.Conn
	closed bool
}

// close closes both sides; it may be called more than once, from any
// goroutine.
func (c *doorConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	c.dev.Close()
	if c.srv != nil {
		c.srv.Close()
	}
}

// setServer gives c its connection to the server, or closes srv and
// reports false when c was closed meanwhile.
func (c *doorConn) setServer(srv net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		srv.Close()
		return false
	}
	c.srv = srv
	return true
}

// newMQTTDoor takes devices on ln (TLS when tc is set) and passes them to
// server srv in this process, or to its listener inner when srv is nil.
func newMQTTDoor(ln net.Listener, tc *tls.Config, srv *server.Server, inner string, auth *localAuth, bounds *mqttBounds, log *slog.Logger) *mqttDoor {
	if tc != nil {
		ln = tls.NewListener(ln, tc)
	}
	return &mqttDoor{ln: ln, srv: srv, inner: inner, auth: auth, bounds: bounds, log: log, acceptErrs: newAcceptErrors(log),
		conns: map[*doorConn]struct{}{}}
}

// start accepts devices until close.
func (d *mqttDoor) start() {
	d.wg.Add(1)
	go func() { // the accept loop: exits when close closes the listener
		defer d.wg.Done()
		failed := 0 // accepts failed in a row
		for {
			c, err := d.ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				d.acceptErrs.note(err) // too many open files and the like
				failed++
				time.Sleep(acceptRetry.Delay(failed))
				continue
			}
			failed = 0
			dc := &doorConn{dev: c}
			if !d.track(dc) {
				c.Close()
				return
			}
			d.wg.Add(1)
			go func() { // one device: exits once the server has it, or when either side closes
				defer d.wg.Done()
				if !d.serve(dc) {
					d.untrack(dc)
				}
			}()
		}
	}()
}

func (d *mqttDoor) track(c *doorConn) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return false
	}
	d.conns[c] = struct{}{}
	return true
}

func (d *mqttDoor) untrack(c *doorConn) {
	c.close()
	d.mu.Lock()
	delete(d.conns, c)
	d.mu.Unlock()
}

// close stops accepting, closes every connection and waits for the
// door's goroutines.
func (d *mqttDoor) close() {
	d.mu.Lock()
	d.done = true
	for c := range d.conns {
		c.close()
	}
	sub := d.sub
	d.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
	d.ln.Close()
	d.wg.Wait()
}

// serve takes one device's CONNECT and, when the door lets it in,
// passes the device to the server. It reports whether the server took
// the connection over: then the server's close of it untracks it.
func (d *mqttDoor) serve(c *doorConn) bool {
	_ = c.dev.SetReadDeadline(time.Now().Add(mqttDoorTimeout))
	br := bufio.NewReaderSize(c.dev, doorReadBuffer)
	var buf []byte
	p, err := readMQTTPacket(br, &buf)
	if err != nil || p.kind() != mqttConnect {
		return false
	}
	cp, err := parseMQTTConnect(p.body)
	if err != nil {
		return false
	}
	if cp.level != 4 {
		_, _ = c.dev.Write(connAck(0x01)) // unacceptable protocol version: MQTT 3.1.1 only
		return false
	}
	program := Anonymous
	if cp.hasUser() {
		prog, ok := d.auth.mqttProgram(cp.username)
		if !ok || !programs.MQTTPasswordMatches(prog.hash, cp.password) {
			_, _ = c.dev.Write(connAck(mqttNotAuthorized))
			return false
		}
		program, cp.password = cp.username, prog.doorPassword
		cp.flags |= mqttConnFlagPassword
	}
	lim := d.auth.mqttLimits(program)
	id := cp.clientID
	if id == "" {
		id = anonymousID(d.anonID.Add(1)) // the server makes one up; a clean session
	}
	if cause := d.bounds.claim(program, id, !cp.clean(), c, lim, d.auth.knownProgram); cause != "" {
		d.bounds.refuse(program, cause, "client ID "+cp.clientID)
		rc := byte(mqttIDRejected)
		if cause == RefusedSessions {
			rc = mqttUnavailable
		}
		_, _ = c.dev.Write(connAck(rc))
		return false
	}
	_ = c.dev.SetReadDeadline(time.Time{})
	r := &doorReader{d: d, br: br, program: program, id: id, lim: lim, pre: appendMQTTPacket(nil, cp.encode())}
	if d.srv != nil {
		d.passInProcess(c, r, func() {
			d.bounds.release(id, c)
			d.untrack(c)
		})
		return true
	}
	defer d.bounds.release(id, c)
	d.passTCP(c, r)
	return false
}

// exchange signs in on the server's listener as program with client ID
// id (a clean session), runs f on the connection, and disconnects.
func (d *mqttDoor) exchange(program, id string, f func(w io.Writer, r *bufio.Reader) error) error {
	cp := mqttConnectPacket{protocol: "MQTT", level: 4, flags: mqttConnFlagClean, keepAlive: 30, clientID: id}
	if program != Anonymous {
		prog, ok := d.auth.mqttProgram(program)
		if !ok {
			return fmt.Errorf("%w: %s is no MQTT program", ErrMQTTProgram, program)
		}
		cp.flags |= mqttConnFlagUsername | mqttConnFlagPassword
		cp.username, cp.password = program, prog.doorPassword
	}
	srv, err := net.DialTimeout("tcp", d.inner, mqttDoorTimeout)
	if err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	defer srv.Close()
	_ = srv.SetDeadline(time.Now().Add(mqttDoorTimeout))
	if _, err := srv.Write(appendMQTTPacket(nil, cp.encode())); err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	r := bufio.NewReader(srv)
	var buf []byte
	ack, err := readMQTTPacket(r, &buf)
	if err != nil || ack.kind() != mqttConnAck || len(ack.body) < 2 || ack.body[1] != mqttAccepted {
		return fmt.Errorf("mqtt: the server did not take the node's connection as %s (%v)", program, err)
	}
	if err := f(srv, r); err != nil {
		return err
	}
	_, err = srv.Write([]byte{mqttDisconnect << 4, 0})
	return err
}

// ErrMQTTProgram: a program the MQTT door does not know.
var ErrMQTTProgram = errors.New("no such MQTT program")

// clearRetained clears the retained messages program's devices keep,
// as one of its devices would (an empty retained publish on each topic):
// on every node, where the mesh carries them.
func (d *mqttDoor) clearRetained(program string) (int, error) {
	st := d.bounds.state(program, d.auth.mqttLimits(program))
	if len(st.Retained) == 0 {
		return 0, nil
	}
	n := 0
	err := d.exchange(program, "meshbox-clear-"+rand.Text(), func(w io.Writer, r *bufio.Reader) error {
		var buf []byte
		for i, t := range st.Retained {
			id := uint16(i%65535 + 1)
			if _, err := w.Write(appendMQTTPacket(nil, publishPacket(t.Topic, nil, id, true))); err != nil {
				return fmt.Errorf("mqtt: %w", err)
			}
			for {
				p, err := readMQTTPacket(r, &buf)
				if err != nil {
					return fmt.Errorf("mqtt: clear %s: %w", t.Topic, err)
				}
				if pi, _ := p.packetID(); p.kind() == mqttPubAck && pi == id {
					break
				}
			}
			d.bounds.retain(program, t.Topic, 0, st.Limits)
			n++
		}
		return nil
	})
	return n, err
}

// clearSessions ends program's sessions: it disconnects their devices and
// has the server drop what it keeps of each (a clean session's CONNECT
// with its client ID).
func (d *mqttDoor) clearSessions(program string) (int, error) {
	st := d.bounds.state(program, d.auth.mqttLimits(program))
	n := 0
	for _, s := range st.Sessions {
		d.bounds.disconnect(program, s.ClientID)
		if err := d.exchange(program, s.ClientID, func(io.Writer, *bufio.Reader) error { return nil }); err != nil {
			return n, err
		}
		d.bounds.forget(program, s.ClientID)
		n++
	}
	return n, nil
}

// hearRetained keeps the door's charges of retained messages to what the
// server's store holds: it reads the store's stream once, then hears
// each message the server stores (nc: the node's own connection).
func (d *mqttDoor) hearRetained(ctx context.Context, nc *nats.Conn) error {
	note := func(subject string, h nats.Header, data []byte) {
		r, err := DecodeRetained(subject, h, data)
		if err != nil {
			return
		}
		topic := h.Get(retainedHdrTopic)
		if topic == "" {
			return
		}
		d.bounds.heardRetained(topic, r.Source, int64(len(r.Payload)), r.Origin == MeshOrigin)
	}
	sub, err := nc.Subscribe(RetainedSubjectPrefix+">", func(m *nats.Msg) { note(m.Subject, m.Header, m.Data) })
	if err != nil {
		return fmt.Errorf("hear retained messages: %w", err)
	}
	d.mu.Lock()
	d.sub = sub
	d.mu.Unlock()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("hear retained messages: %w", err)
	}
	st, err := js.Stream(ctx, RetainedStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read retained messages: %w", err)
	}
	if st.CachedInfo().State.Msgs == 0 {
		return nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return fmt.Errorf("read retained messages: %w", err)
	}
	for {
		msgs, err := cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return fmt.Errorf("read retained messages: %w", err)
		}
		got, pending := 0, uint64(0)
		for m := range msgs.Messages() {
			got++
			note(m.Subject(), m.Headers(), m.Data())
			if md, err := m.Metadata(); err == nil {
				pending = md.NumPending
			}
		}
		if got == 0 || pending == 0 {
			return msgs.Error()
		}
	}
}

// newDoorPassword makes a program's door password.
func newDoorPassword() string {
	b := make([]byte, doorPasswordLen)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return fmt.Sprintf("%x", b)
}

// MQTTProgram is what program's MQTT devices keep in the store
// (localnats.Anonymous: clients without a credential), and how often the
// door refused them.
func (n *Server) MQTTProgram(program string) (MQTTProgramState, error) {
	if n.door == nil {
		return MQTTProgramState{}, ErrNoMQTT
	}
	if !n.auth.knownProgram(program) {
		return MQTTProgramState{}, fmt.Errorf("%w: %s", ErrMQTTProgram, program)
	}
	return n.door.bounds.state(program, n.auth.mqttLimits(program)), nil
}

// ClearMQTT clears program's retained messages (as its devices would, on
// every node the mesh carries them to) and ends its sessions (devices
// disconnected, what the server keeps of them dropped), as asked; it
// returns how many of each it cleared.
func (n *Server) ClearMQTT(program string, retained, sessions bool) (nRetained, nSessions int, err error) {
	if n.door == nil {
		return 0, 0, ErrNoMQTT
	}
	if !n.auth.knownProgram(program) {
		return 0, 0, fmt.Errorf("%w: %s", ErrMQTTProgram, program)
	}
	if retained {
		if nRetained, err = n.door.clearRetained(program); err != nil {
			return nRetained, 0, err
		}
	}
	if sessions {
		nSessions, err = n.door.clearSessions(program)
	}
	return nRetained, nSessions, err
}

// MQTTRefusals counts the door's refusals by program and cause (nil
// without an MQTT listener).
func (n *Server) MQTTRefusals() map[string]map[string]uint64 {
	if n.door == nil {
		return nil
	}
	return n.door.bounds.refusals()
}

// ErrNoMQTT: the node has no MQTT listener.
var ErrNoMQTT = errors.New("this node has no MQTT listener (nats_mqtt)")
