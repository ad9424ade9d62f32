package meshtest

import (
	"bytes"
	wirebin "encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// The proxy carries bytes both ways unchanged and counts them, per
// direction, over every connection.
func TestCountingProxyCounts(t *testing.T) {
	px := NewCountingProxy(t, echoServer(t))
	for range 2 {
		c, err := net.DialTimeout("tcp", px.Addr(), time.Second)
		if err != nil {
			t.Fatalf("dial proxy: %v", err)
		}
		for range 3 {
			if err := roundTrip(c, 2*time.Second); err != nil {
				t.Fatalf("through the proxy: %v", err)
			}
		}
		c.Close()
	}
	want := int64(2 * 3 * len("ping\n"))
	WaitFor(t, 2*time.Second, "the proxy counted every byte", func() bool { return px.Up() == want && px.Down() == want })
	if got := px.Connections(); got != 2 {
		t.Fatalf("connections: got %d, want 2", got)
	}
	if got := px.Frames()[FrameKind{Dir: "up", Method: "unparsed"}].Bytes; got != want {
		t.Fatalf("bytes that are not AMQP: got %d, want %d counted as unparsed", got, want)
	}
	px.Close()
	px.Close() // idempotent
	if c, err := net.DialTimeout("tcp", px.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("the proxy accepts connections after Close")
	}
}

// frame is one AMQP 0-9-1 frame.
func frame(typ byte, channel uint16, payload []byte) []byte {
	var b bytes.Buffer
	b.WriteByte(typ)
	_ = wirebin.Write(&b, wirebin.BigEndian, channel)
	_ = wirebin.Write(&b, wirebin.BigEndian, uint32(len(payload)))
	b.Write(payload)
	b.WriteByte(0xCE)
	return b.Bytes()
}

func shortstr(s string) []byte { return append([]byte{byte(len(s))}, s...) }

// method is a method frame's payload: class, method, arguments.
func method(class, id uint16, args ...[]byte) []byte {
	p := wirebin.BigEndian.AppendUint16(nil, class)
	p = wirebin.BigEndian.AppendUint16(p, id)
	for _, a := range args {
		p = append(p, a...)
	}
	return p
}

// contentHeader is a content header frame's payload with no properties.
func contentHeader(bodySize uint64) []byte {
	p := wirebin.BigEndian.AppendUint16(nil, 60)
	p = wirebin.BigEndian.AppendUint16(p, 0)
	p = wirebin.BigEndian.AppendUint64(p, bodySize)
	return wirebin.BigEndian.AppendUint16(p, 0)
}

// The proxy reads the AMQP frames it carries, fed in pieces of any size:
// a message counts once under its method and routing key (the node of a
// to.<node>. key made general), with the bytes of its method, header and
// body frames.
func TestCountingProxyReadsAMQPFrames(t *testing.T) {
	publish := frame(1, 1, method(60, 40, []byte{0, 0}, shortstr("mesh"), shortstr("to.alpha.sys.probe"), []byte{1}))
	header := frame(2, 1, contentHeader(3))
	body := frame(3, 1, []byte("abc"))
	heartbeat := frame(8, 0, nil)
	up := bytes.Join([][]byte{[]byte("AMQP\x00\x00\x09\x01"), publish, header, body, heartbeat, publish, frame(2, 1, contentHeader(0))}, nil)
	deliver := frame(1, 2, method(60, 60, shortstr("system"), make([]byte, 8), []byte{0}, shortstr("mesh"), shortstr("sys.heartbeat")))
	ack := frame(1, 1, method(60, 80, make([]byte, 8), []byte{0}))
	down := bytes.Join([][]byte{deliver, frame(2, 2, contentHeader(0)), ack}, nil)

	// An upstream that takes what comes and sends down once the client
	// has sent everything.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	served := make(chan struct{})
	go func() { // exits once it served the one connection
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := io.ReadFull(c, make([]byte, len(up))); err != nil {
			return
		}
		for i := 0; i < len(down); i += 5 { // in pieces that cut frames
			_, _ = c.Write(down[i:min(i+5, len(down))])
			time.Sleep(time.Millisecond)
		}
	}()
	px := NewCountingProxy(t, ln.Addr().String())
	c, err := net.DialTimeout("tcp", px.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < len(up); i += 3 {
		if _, err := c.Write(up[i:min(i+3, len(up))]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := io.ReadFull(c, make([]byte, len(down))); err != nil {
		t.Fatal(err)
	}
	<-served
	WaitFor(t, 2*time.Second, "the proxy counted every byte", func() bool {
		return px.Up() == int64(len(up)) && px.Down() == int64(len(down))
	})
	got := px.Frames()
	want := FrameStats{
		{Dir: "up", Method: "protocol-header"}:                       {Count: 1, Bytes: 8},
		{Dir: "up", Method: "basic.publish", Key: "to.*.sys.probe"}:  {Count: 2, Bytes: int64(2*len(publish) + len(header) + len(body) + len(header))},
		{Dir: "up", Method: "heartbeat"}:                             {Count: 1, Bytes: int64(len(heartbeat))},
		{Dir: "down", Method: "basic.deliver", Key: "sys.heartbeat"}: {Count: 1, Bytes: int64(len(deliver) + len(header))},
		{Dir: "down", Method: "basic.ack"}:                           {Count: 1, Bytes: int64(len(ack))},
	}
	if len(got) != len(want) {
		t.Fatalf("frames: got %v, want %v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%+v: got %+v, want %+v", k, got[k], w)
		}
	}
	if d := got.Sub(want); len(d) != 0 {
		t.Errorf("Sub of the same counts: got %v, want nothing", d)
	}
}
