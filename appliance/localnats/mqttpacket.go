package localnats

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The few MQTT 3.1.1 packets the node's MQTT door (mqttdoor.go) reads or
// writes itself: the codec, with no connection state. Everything else it
// passes to the server as it came.

// MQTT control packet types (the high nibble of a packet's first byte).
const (
	mqttConnect    = 1
	mqttConnAck    = 2
	mqttPublish    = 3
	mqttPubAck     = 4
	mqttPubRel     = 6
	mqttDisconnect = 14
)

// CONNACK return codes.
const (
	mqttAccepted          = 0x00
	mqttIDRejected        = 0x02 // identifier rejected
	mqttUnavailable       = 0x03 // server unavailable
	mqttNotAuthorized     = 0x05
	mqttConnFlagClean     = 0x02
	mqttConnFlagWill      = 0x04
	mqttConnFlagWillQoS   = 0x18
	mqttConnFlagWillRet   = 0x20
	mqttConnFlagPassword  = 0x40
	mqttConnFlagUsername  = 0x80
	mqttPublishRetainFlag = 0x01
)

// mqttMaxPacket bounds a packet the door reads whole: the server's
// largest payload and room for a topic.
const mqttMaxPacket = 1<<20 + 64<<10

// Errors of reading a packet.
var errMQTTPacket = errors.New("malformed MQTT packet")

// mqttPacket is one control packet: its first byte and its body (what
// follows the remaining length).
type mqttPacket struct {
	first byte
	body  []byte
}

func (p mqttPacket) kind() byte { return p.first >> 4 }

// readMQTTPacket reads one packet from r into buf's storage (grown as
// needed) and returns it; its body is valid until the next read into buf.
func readMQTTPacket(r *bufio.Reader, buf *[]byte) (mqttPacket, error) {
	first, err := r.ReadByte()
	if err != nil {
		return mqttPacket{}, err
	}
	n, mult := 0, 1
	for i := 0; ; i++ {
		b, err := r.ReadByte()
		if err != nil {
			return mqttPacket{}, unexpected(err)
		}
		n += int(b&0x7f) * mult
		if b&0x80 == 0 {
			break
		}
		if mult *= 128; i == 3 {
			return mqttPacket{}, fmt.Errorf("%w: remaining length", errMQTTPacket)
		}
	}
	if n > mqttMaxPacket {
		return mqttPacket{}, fmt.Errorf("%w: %d bytes", errMQTTPacket, n)
	}
	if cap(*buf) < n {
		*buf = make([]byte, n)
	}
	body := (*buf)[:n]
	if _, err := io.ReadFull(r, body); err != nil {
		return mqttPacket{}, unexpected(err)
	}
	return mqttPacket{first: first, body: body}, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// appendMQTTPacket appends p, framed, to dst.
func appendMQTTPacket(dst []byte, p mqttPacket) []byte {
	dst = append(dst, p.first)
	n := len(p.body)
	for {
		b := byte(n % 128)
		if n /= 128; n > 0 {
			b |= 0x80
		}
		dst = append(dst, b)
		if n == 0 {
			break
		}
	}
	return append(dst, p.body...)
}

// mqttConnectPacket is a CONNECT's content.
type mqttConnectPacket struct {
	protocol  string
	level     byte
	flags     byte
	keepAlive uint16
	clientID  string
	willTopic string
	willMsg   []byte
	username  string
	password  string
}

func (c *mqttConnectPacket) clean() bool { return c.flags&mqttConnFlagClean != 0 }
func (c *mqttConnectPacket) hasUser() bool {
	return c.flags&mqttConnFlagUsername != 0
}

// parseMQTTConnect reads a CONNECT's body.
func parseMQTTConnect(body []byte) (mqttConnectPacket, error) {
	var c mqttConnectPacket
	r := mqttReader{b: body}
	c.protocol = r.str()
	c.level = r.byte()
	c.flags = r.byte()
	c.keepAlive = r.uint16()
	c.clientID = r.str()
	if c.flags&mqttConnFlagWill != 0 {
		c.willTopic = r.str()
		c.willMsg = r.bytes()
	}
	if c.flags&mqttConnFlagUsername != 0 {
		c.username = r.str()
	}
	if c.flags&mqttConnFlagPassword != 0 {
		c.password = string(r.bytes())
	}
	if r.err || len(r.b) != 0 {
		return c, fmt.Errorf("%w: CONNECT", errMQTTPacket)
	}
	return c, nil
}

// encode is c as a CONNECT packet.
func (c *mqttConnectPacket) encode() mqttPacket {
	var b []byte
	b = appendMQTTString(b, []byte(c.protocol))
	b = append(b, c.level, c.flags)
	b = binary.BigEndian.AppendUint16(b, c.keepAlive)
	b = appendMQTTString(b, []byte(c.clientID))
	if c.flags&mqttConnFlagWill != 0 {
		b = appendMQTTString(b, []byte(c.willTopic))
		b = appendMQTTString(b, c.willMsg)
	}
	if c.flags&mqttConnFlagUsername != 0 {
		b = appendMQTTString(b, []byte(c.username))
	}
	if c.flags&mqttConnFlagPassword != 0 {
		b = appendMQTTString(b, []byte(c.password))
	}
	return mqttPacket{first: mqttConnect << 4, body: b}
}

// connAck is a CONNACK with return code rc (no session present).
func connAck(rc byte) []byte { return []byte{mqttConnAck << 4, 2, 0, rc} }

// mqttPublishPacket is what the door reads of a PUBLISH: its topic, QoS,
// packet identifier (QoS 1 and 2) and payload's size.
type mqttPublishPacket struct {
	topic   string
	qos     byte
	retain  bool
	id      uint16
	payload int
}

func parseMQTTPublish(p mqttPacket) (mqttPublishPacket, error) {
	r := mqttReader{b: p.body}
	pub := mqttPublishPacket{topic: r.str(), qos: (p.first >> 1) & 3, retain: p.first&mqttPublishRetainFlag != 0}
	if pub.qos > 0 {
		pub.id = r.uint16()
	}
	if r.err || pub.qos > 2 {
		return pub, fmt.Errorf("%w: PUBLISH", errMQTTPacket)
	}
	pub.payload = len(r.b)
	return pub, nil
}

// publishPacket is a PUBLISH of payload on topic with QoS 1 and packet
// identifier id, retained if retain.
func publishPacket(topic string, payload []byte, id uint16, retain bool) mqttPacket {
	first := byte(mqttPublish<<4 | 1<<1)
	if retain {
		first |= mqttPublishRetainFlag
	}
	b := appendMQTTString(nil, []byte(topic))
	b = binary.BigEndian.AppendUint16(b, id)
	return mqttPacket{first: first, body: append(b, payload...)}
}

// packetID is the packet identifier of a PUBACK, PUBREC, PUBREL or PUBCOMP.
func (p mqttPacket) packetID() (uint16, bool) {
	if len(p.body) < 2 {
		return 0, false
	}
	return binary.BigEndian.Uint16(p.body), true
}

func appendMQTTString(b, s []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// mqttReader reads the fields of a packet's body; err says one was
// short.
type mqttReader struct {
	b   []byte
	err bool
}

func (r *mqttReader) byte() byte {
	if len(r.b) < 1 {
		r.err = true
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *mqttReader) uint16() uint16 {
	if len(r.b) < 2 {
		r.err = true
		r.b = nil
		return 0
	}
	v := binary.BigEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}

func (r *mqttReader) bytes() []byte {
	n := int(r.uint16())
	if len(r.b) < n {
		r.err = true
		r.b = nil
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *mqttReader) str() string { return string(r.bytes()) }
