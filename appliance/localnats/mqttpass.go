package localnats

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"unsafe"

	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/nats-io/nats-server/v2/server"
)

// How a device's bytes pass the door once its CONNECT is taken. The
// door checks what the device sends as the server reads it: the server
// reads from a doorReader, which parses the header of each packet in
// place in its buffer, applies the program's limits, and gives the
// server whole runs of checked bytes in one read. What the server sends
// goes to the device as it comes, and needs no look.
//
// The server takes the device's connection in this process
// (createMQTTClient below): no second connection, no goroutine of the
// door's and no copy on the way back. A loopback TCP hop to the server's
// listener costs each packet a write, a read and a wake-up of the
// door's goroutine on each side; measured, about 11 µs a direction on a
// two-core machine, where the server's whole round of a QoS 0 message
// from one device to another is about 31 µs (BenchmarkMQTTDoor). Where
// that way is not there (another server version), the door dials the
// server's listener on loopback and copies (passTCP). A version without
// the constructor fails to link: it is never called blind.

// createMQTTClient is the server's own constructor of an MQTT client on
// an accepted connection (what its MQTT listener runs for each
// connection it accepts, and its WebSocket listener with ws set): it
// starts the client's read and write loops on conn. The server does not
// export it; its signature is that of the version in
// inProcessNATSVersion, and the door calls it with that version only.
//
//go:linkname createMQTTClient github.com/nats-io/nats-server/v2/server.(*Server).createMQTTClient
func createMQTTClient(s *server.Server, conn net.Conn, ws unsafe.Pointer) unsafe.Pointer

// inProcessNATSVersion is the server's version whose createMQTTClient
// the door was checked against: (s *Server) createMQTTClient(conn
// net.Conn, ws *websocket) *client. With another version the door
// passes devices over loopback TCP (TestMQTTDoorInProcess says so).
const inProcessNATSVersion = "2.15.2"

// inProcessMQTT reports whether the door hands devices to the server in
// this process.
func inProcessMQTT() bool { return server.VERSION == inProcessNATSVersion }

// errMQTTRefused ends a device's connection: it went past a limit the
// door enforces by closing (the program's unreleased QoS 2 publishes).
var errMQTTRefused = errors.New("mqtt: past its program's limit")

// doorReader is what the server reads of one device: first the CONNECT
// the door made (pre), then the device's packets, each checked against
// its program's limits as its header comes. It is read by one goroutine
// at a time.
type doorReader struct {
	d           *mqttDoor
	br          *bufio.Reader // the device's connection
	program, id string
	lim         programs.MQTTLimits
	pre         []byte // to give before the device's next bytes
	rest        int    // bytes of the current packet still to pass as they are
	err         error  // to return once what was checked before it is read
}

// Read gives p as many checked bytes as the device has sent, and waits
// for the device only when it has none to give.
func (r *doorReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		switch {
		case len(r.pre) > 0:
			k := copy(p[n:], r.pre)
			r.pre = r.pre[k:]
			n += k
		case r.err != nil:
			if n > 0 {
				return n, nil
			}
			return 0, r.err
		case r.rest > 0:
			if n > 0 && r.br.Buffered() == 0 {
				return n, nil
			}
			k, err := r.br.Read(p[n : n+min(r.rest, len(p)-n)])
			r.rest -= k
			n += k
			if err != nil {
				r.err = unexpected(err)
			}
		default:
			more, err := r.next(p, &n)
			if err != nil {
				r.err = err
			} else if !more {
				return n, nil
			}
		}
	}
	return n, nil
}

// next reads the header of the device's next packet, checks it and
// gives it to p at *n (or to pre when p has no room for it at all); it
// reports false, having read nothing, when p holds bytes already and the
// header is not all there, or has no room in p.
func (r *doorReader) next(p []byte, n *int) (bool, error) {
	have := func(k int) bool { return *n == 0 || r.br.Buffered() >= k }
	// The fixed header: the first byte, and the remaining length in one
	// to four bytes.
	var b []byte
	size, hl := 0, 0
	for i := 1; hl == 0; i++ {
		if !have(i + 1) {
			return false, nil
		}
		var err error
		if b, err = r.br.Peek(i + 1); err != nil {
			return false, unexpected(err)
		}
		size |= int(b[i]&0x7f) << (7 * (i - 1))
		switch {
		case b[i]&0x80 == 0:
			hl = i + 1
		case i == 4:
			return false, fmt.Errorf("%w: remaining length", errMQTTPacket)
		}
	}
	if size > mqttMaxPacket {
		return false, fmt.Errorf("%w: %d bytes", errMQTTPacket, size)
	}
	// What the door reads of the body: a PUBLISH's topic and packet
	// identifier, a PUBREL's packet identifier.
	need := hl
	switch first := b[0]; first >> 4 {
	case mqttPublish:
		need = hl + min(size, 2)
		if size >= 2 {
			if !have(hl + 2) {
				return false, nil
			}
			b, err := r.br.Peek(hl + 2)
			if err != nil {
				return false, unexpected(err)
			}
			vh := 2 + int(binary.BigEndian.Uint16(b[hl:]))
			if (first>>1)&3 > 0 {
				vh += 2
			}
			need = hl + min(size, vh)
		}
	case mqttPubRel:
		need = hl + min(size, 2)
	}
	if *n > 0 && (len(p)-*n < need || r.br.Buffered() < need) {
		return false, nil
	}
	var hdr []byte
	var err error
	inBuf := need <= r.br.Size()
	if inBuf {
		hdr, err = r.br.Peek(need)
	} else { // a topic longer than the buffer: read apart
		hdr = make([]byte, need)
		_, err = io.ReadFull(r.br, hdr)
	}
	if err != nil {
		return false, unexpected(err)
	}
	first, err := r.check(hdr[0], hdr[hl:], size-(need-hl))
	if err != nil {
		return false, err
	}
	if len(p)-*n >= need {
		copy(p[*n:], hdr)
		p[*n] = first
		*n += need
	} else {
		r.pre = append([]byte(nil), hdr...)
		r.pre[0] = first
	}
	if inBuf {
		_, _ = r.br.Discard(need) // peeked: cannot fail
	}
	r.rest = size - (need - hl)
	return true, nil
}

// check holds a packet of the device (its first byte, the start of its
// body as next read it, and the size of the rest) to its program's
// limits: it returns the first byte to pass on, or errMQTTRefused.
func (r *doorReader) check(first byte, body []byte, rest int) (byte, error) {
	d := r.d
	switch first >> 4 {
	case mqttPublish:
		qos := (first >> 1) & 3
		mr := mqttReader{b: body}
		topic := mr.bytes()
		var pi uint16
		if qos > 0 {
			pi = mr.uint16()
		}
		if mr.err || qos > 2 {
			return first, nil // the server answers it
		}
		if first&mqttPublishRetainFlag != 0 {
			t := string(topic)
			if cause := d.bounds.retain(r.program, t, int64(rest), r.lim); cause != "" {
				d.bounds.refuse(r.program, cause, "retained topic "+t)
				first &^= mqttPublishRetainFlag
			}
		}
		if qos == 2 && !d.bounds.holdQoS2(r.id, pi, r.lim) {
			d.bounds.refuse(r.program, RefusedInflight, "client ID "+r.id)
			return first, errMQTTRefused
		}
	case mqttPubRel:
		if len(body) >= 2 {
			d.bounds.releaseQoS2(r.id, binary.BigEndian.Uint16(body))
		}
	}
	return first, nil
}

// serverSide is the device's connection as the server has it: it reads
// through the door's checks, writes to the device as it is, and on close
// runs done once.
type serverSide struct {
	net.Conn
	r    *doorReader
	once sync.Once
	done func()
}

func (s *serverSide) Read(p []byte) (int, error) { return s.r.Read(p) }

func (s *serverSide) Close() error {
	s.once.Do(s.done)
	return nil
}

// tcpServerSide is serverSide on a device's plain TCP connection: the
// server's writes of several buffers go out in one writev, as on its
// own listener (net.Buffers uses the embedded *net.TCPConn's).
type tcpServerSide struct {
	*net.TCPConn
	s *serverSide
}

func (t *tcpServerSide) Read(p []byte) (int, error) { return t.s.r.Read(p) }
func (t *tcpServerSide) Close() error               { return t.s.Close() }

// passInProcess hands device c, whose CONNECT r gives first, to the
// server; done runs once when the server closes the connection (its
// Close closes the device's).
func (d *mqttDoor) passInProcess(c *doorConn, r *doorReader, done func()) {
	s := &serverSide{Conn: c.dev, r: r, done: func() {
		c.close()
		done()
	}}
	var conn net.Conn = s
	if tc, ok := c.dev.(*net.TCPConn); ok {
		conn = &tcpServerSide{TCPConn: tc, s: s}
	}
	if !d.srv.Running() {
		_ = conn.Close()
		return
	}
	createMQTTClient(d.srv, conn, nil)
}

// passTCP passes device c, whose CONNECT r gives first, to the server's
// listener on loopback, until either side closes.
func (d *mqttDoor) passTCP(c *doorConn, r *doorReader) {
	srv, err := net.DialTimeout("tcp", d.inner, mqttDoorTimeout)
	if err != nil {
		d.log.Warn("MQTT device not passed to the server", "err", err)
		_, _ = c.dev.Write(connAck(mqttUnavailable))
		return
	}
	if !c.setServer(srv) {
		return
	}
	back := make(chan struct{})
	go func() { // the server's side to the device: exits when either side closes
		defer close(back)
		_, _ = io.Copy(c.dev, srv) // spliced between TCP connections
		c.close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := srv.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	c.close()
	<-back
}
