package meshtest

import (
	wirebin "encoding/binary"
	"fmt"
	"maps"
	"strings"
	"sync"
)

// FrameKind is one kind of traffic a CountingProxy carried, read from the
// AMQP 0-9-1 frames: the direction ("up" to the broker, "down" from it),
// the method ("basic.publish", "heartbeat", "protocol-header", or
// "unparsed" for bytes that are not AMQP 0-9-1, such as TLS) and, for
// basic.publish, basic.deliver and basic.return, the routing key with the
// node name of a to.<node>. key replaced by "*" (to.*.sys.ping).
type FrameKind struct {
	Dir    string
	Method string
	Key    string
}

// FrameStat is how many frames of a kind were carried and their bytes: a
// method with content (a message) counts once, with the bytes of its
// method, content header and body frames.
type FrameStat struct {
	Count int64
	Bytes int64
}

// FrameStats is what a CountingProxy carried, by kind.
type FrameStats map[FrameKind]FrameStat

// Sub returns what s holds beyond prev (an earlier snapshot).
func (s FrameStats) Sub(prev FrameStats) FrameStats {
	out := FrameStats{}
	for k, v := range s {
		d := FrameStat{Count: v.Count - prev[k].Count, Bytes: v.Bytes - prev[k].Bytes}
		if d.Count != 0 || d.Bytes != 0 {
			out[k] = d
		}
	}
	return out
}

// frameTally sums the frames of every connection of a proxy.
type frameTally struct {
	mu sync.Mutex
	m  FrameStats
}

func (t *frameTally) init() { t.m = FrameStats{} }

func (t *frameTally) add(k FrameKind, count, bytes int64) {
	t.mu.Lock()
	s := t.m[k]
	s.Count += count
	s.Bytes += bytes
	t.m[k] = s
	t.mu.Unlock()
}

func (t *frameTally) snapshot() FrameStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.m)
}

// reader returns a frame reader for one direction of one connection.
func (t *frameTally) reader(dir string) *frameReader {
	return &frameReader{tally: t, dir: dir, preamble: dir == "up", content: map[uint16]FrameKind{}}
}

// frameReader reads the frames of one direction of one connection, fed
// in the pieces the connection delivers. It is used by one goroutine.
type frameReader struct {
	tally    *frameTally
	dir      string
	buf      []byte
	preamble bool                 // the client's protocol header is still to come
	broken   bool                 // not AMQP 0-9-1: the rest is counted as unparsed
	content  map[uint16]FrameKind // per channel: the message whose content frames follow
}

const (
	frameMethod    = 1
	frameHeader    = 2
	frameBody      = 3
	frameHeartbeat = 8
	frameEnd       = 0xCE
	protocolHeader = "AMQP\x00\x00\x09\x01"
)

func (r *frameReader) feed(p []byte) {
	if r.broken {
		r.tally.add(FrameKind{Dir: r.dir, Method: "unparsed"}, 0, int64(len(p)))
		return
	}
	r.buf = append(r.buf, p...)
	if r.preamble {
		if len(r.buf) < len(protocolHeader) {
			return
		}
		if string(r.buf[:len(protocolHeader)]) != protocolHeader {
			r.breakOff()
			return
		}
		r.tally.add(FrameKind{Dir: r.dir, Method: "protocol-header"}, 1, int64(len(protocolHeader)))
		r.buf = r.buf[len(protocolHeader):]
		r.preamble = false
	}
	for len(r.buf) >= 7 {
		size := int(wirebin.BigEndian.Uint32(r.buf[3:7]))
		total := 7 + size + 1
		if size > 16<<20 {
			r.breakOff()
			return
		}
		if len(r.buf) < total {
			break
		}
		frame := r.buf[:total]
		if frame[total-1] != frameEnd {
			r.breakOff()
			return
		}
		r.frame(frame[0], wirebin.BigEndian.Uint16(frame[1:3]), frame[7:total-1], int64(total))
		r.buf = r.buf[total:]
	}
	if len(r.buf) == 0 {
		r.buf = nil // let a large frame's buffer go
	}
}

// breakOff counts what is buffered as unparsed and stops reading frames.
func (r *frameReader) breakOff() {
	r.broken = true
	r.tally.add(FrameKind{Dir: r.dir, Method: "unparsed"}, 0, int64(len(r.buf)))
	r.buf = nil
}

func (r *frameReader) frame(typ byte, channel uint16, payload []byte, n int64) {
	switch typ {
	case frameMethod:
		if len(payload) < 4 {
			r.tally.add(FrameKind{Dir: r.dir, Method: "method?"}, 1, n)
			return
		}
		class, method := wirebin.BigEndian.Uint16(payload[0:2]), wirebin.BigEndian.Uint16(payload[2:4])
		k := FrameKind{Dir: r.dir, Method: methodName(class, method)}
		if class == 60 && (method == 40 || method == 50 || method == 60 || method == 71) {
			k.Key = generalKey(routingKey(method, payload[4:]))
			r.content[channel] = k
		}
		r.tally.add(k, 1, n)
	case frameHeader, frameBody:
		k, ok := r.content[channel]
		if !ok {
			k = FrameKind{Dir: r.dir, Method: "content?"}
		}
		r.tally.add(k, 0, n)
	case frameHeartbeat:
		r.tally.add(FrameKind{Dir: r.dir, Method: "heartbeat"}, 1, n)
	default:
		r.tally.add(FrameKind{Dir: r.dir, Method: fmt.Sprintf("frame-%d", typ)}, 1, n)
	}
}

// routingKey reads the routing key from the arguments of basic.publish
// (40), basic.return (50), basic.deliver (60) or basic.get-ok (71); ""
// when they are cut short.
func routingKey(method uint16, args []byte) string {
	var skip []int // the fields before the exchange: fixed sizes, or -1 for a short string
	switch method {
	case 40:
		skip = []int{2} // reserved-1
	case 50:
		skip = []int{2, -1} // reply-code, reply-text
	case 60:
		skip = []int{-1, 8, 1} // consumer-tag, delivery-tag, redelivered
	case 71:
		skip = []int{8, 1} // delivery-tag, redelivered
	}
	skip = append(skip, -1) // the exchange
	for _, s := range skip {
		if s < 0 {
			if len(args) < 1 || len(args) < 1+int(args[0]) {
				return ""
			}
			s = 1 + int(args[0])
		}
		if len(args) < s {
			return ""
		}
		args = args[s:]
	}
	if len(args) < 1 || len(args) < 1+int(args[0]) {
		return ""
	}
	return string(args[1 : 1+int(args[0])])
}

// generalKey replaces the node of a to.<node>. routing key with "*".
func generalKey(key string) string {
	rest, ok := strings.CutPrefix(key, "to.")
	if !ok {
		return key
	}
	if i := strings.IndexByte(rest, '.'); i >= 0 {
		return "to.*" + rest[i:]
	}
	return key
}

// methodNames are the AMQP 0-9-1 methods, by class and method id.
var methodNames = map[uint16]struct {
	class   string
	methods map[uint16]string
}{
	10: {"connection", map[uint16]string{10: "start", 11: "start-ok", 20: "secure", 21: "secure-ok", 30: "tune", 31: "tune-ok",
		40: "open", 41: "open-ok", 50: "close", 51: "close-ok", 60: "blocked", 61: "unblocked", 70: "update-secret", 71: "update-secret-ok"}},
	20: {"channel", map[uint16]string{10: "open", 11: "open-ok", 20: "flow", 21: "flow-ok", 40: "close", 41: "close-ok"}},
	40: {"exchange", map[uint16]string{10: "declare", 11: "declare-ok", 20: "delete", 21: "delete-ok", 30: "bind", 31: "bind-ok", 40: "unbind", 51: "unbind-ok"}},
	50: {"queue", map[uint16]string{10: "declare", 11: "declare-ok", 20: "bind", 21: "bind-ok", 30: "purge", 31: "purge-ok",
		40: "delete", 41: "delete-ok", 50: "unbind", 51: "unbind-ok"}},
	60: {"basic", map[uint16]string{10: "qos", 11: "qos-ok", 20: "consume", 21: "consume-ok", 30: "cancel", 31: "cancel-ok",
		40: "publish", 50: "return", 60: "deliver", 70: "get", 71: "get-ok", 72: "get-empty", 80: "ack", 90: "reject",
		100: "recover-async", 110: "recover", 111: "recover-ok", 120: "nack"}},
	85: {"confirm", map[uint16]string{10: "select", 11: "select-ok"}},
	90: {"tx", map[uint16]string{10: "select", 11: "select-ok", 20: "commit", 21: "commit-ok", 30: "rollback", 31: "rollback-ok"}},
}

func methodName(class, method uint16) string {
	c, ok := methodNames[class]
	if !ok {
		return fmt.Sprintf("%d.%d", class, method)
	}
	if m, ok := c.methods[method]; ok {
		return c.class + "." + m
	}
	return fmt.Sprintf("%s.%d", c.class, method)
}
