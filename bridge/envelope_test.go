package bridge

import (
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

func goodDelivery(kind string) delivery {
	d := delivery{Type: kind, Headers: amqp.Table{HeaderOrigin: "alpha"}, MessageId: "m1", Body: []byte("b")}
	switch kind {
	case typeRequest:
		d.RoutingKey, d.CorrelationId, d.ReplyTo = "to.beta.req.echo", "c1", "node.alpha.replies"
	case typeReply:
		d.CorrelationId = "c1"
	case typeCommand:
		d.RoutingKey = "cmd.resize"
	case typeEvent:
		d.RoutingKey = "evt.order.created"
	case typeSystem:
		d.RoutingKey = "sys.hello"
	}
	return d
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name   string
		kind   string
		edit   func(*delivery)
		errHas string // "" = valid
	}{
		{"request", typeRequest, nil, ""},
		{"request to the queue", typeRequest, func(d *delivery) {
			d.RoutingKey = "node.beta.requests"
			d.Headers[HeaderCapability] = "echo.v2"
		}, ""},
		{"request to the queue without capability", typeRequest, func(d *delivery) { d.RoutingKey = "node.beta.requests" }, HeaderCapability},
		{"request bad capability header", typeRequest, func(d *delivery) {
			d.RoutingKey = "node.beta.requests"
			d.Headers[HeaderCapability] = "a.*"
		}, "not a capability name"},
		{"reply", typeReply, func(d *delivery) { delete(d.Headers, HeaderOrigin) }, ""},
		{"command", typeCommand, nil, ""},
		{"event", typeEvent, nil, ""},
		{"system", typeSystem, nil, ""},
		{"system addressed", typeSystem, func(d *delivery) { d.RoutingKey = "to.alpha.sys.x" }, ""},
		{"wrong type", typeCommand, func(d *delivery) { d.Type = "event" }, "type"},
		{"no type", typeEvent, func(d *delivery) { d.Type = "" }, "type"},
		{"request no correlation id", typeRequest, func(d *delivery) { d.CorrelationId = "" }, "correlation id"},
		{"request reply-to elsewhere", typeRequest, func(d *delivery) { d.ReplyTo = "some.queue" }, "reply-to"},
		{"request bad key", typeRequest, func(d *delivery) { d.RoutingKey = "cmd.x" }, "routing key"},
		{"request bad timeout", typeRequest, func(d *delivery) { d.Headers[HeaderTimeout] = "soon" }, "duration"},
		{"request negative timeout", typeRequest, func(d *delivery) { d.Headers[HeaderTimeout] = "-1s" }, "duration"},
		{"command no id", typeCommand, func(d *delivery) { d.MessageId = "" }, "message id"},
		{"command id with space", typeCommand, func(d *delivery) { d.MessageId = "a b" }, "message id"},
		{"command wildcard key", typeCommand, func(d *delivery) { d.RoutingKey = "cmd.*" }, "routing key"},
		{"event no origin", typeEvent, func(d *delivery) { delete(d.Headers, HeaderOrigin) }, HeaderOrigin},
		{"event origin not a string", typeEvent, func(d *delivery) { d.Headers[HeaderOrigin] = int32(5) }, "want string"},
		{"event origin invalid", typeEvent, func(d *delivery) { d.Headers[HeaderOrigin] = "a.b" }, HeaderOrigin},
		{"header int", typeEvent, func(d *delivery) { d.Headers["X-N"] = int64(1) }, "want string"},
		{"header table", typeEvent, func(d *delivery) { d.Headers["X-T"] = amqp.Table{"a": "b"} }, "want string"},
		{"header array of ints", typeEvent, func(d *delivery) { d.Headers["X-A"] = []any{int64(1)} }, "want strings"},
		{"header bad key", typeEvent, func(d *delivery) { d.Headers["a b"] = "x" }, "not allowed"},
		{"header status", typeEvent, func(d *delivery) { d.Headers["Status"] = "503" }, "not allowed"},
		{"header line break", typeEvent, func(d *delivery) { d.Headers["X-A"] = "a\r\nb: c" }, "line break"},
		{"content type line break", typeEvent, func(d *delivery) { d.ContentType = "a\nb" }, "line break"},
		{"headers too big", typeEvent, func(d *delivery) { d.Headers["X-Big"] = strings.Repeat("x", maxHeaderBytes) }, "exceed"},
		{"delivery count not a number", typeCommand, func(d *delivery) { d.Redelivered = true; d.Headers["x-delivery-count"] = "1" }, "integer"},
		{"payload too large", typeEvent, func(d *delivery) { d.Body = make([]byte, 101) }, "exceeds"},
		{"broker headers ignored", typeEvent, func(d *delivery) {
			d.Headers["x-received-from"] = []any{amqp.Table{"uri": "amqp://elsewhere"}}
			d.Headers["x-delivery-count"] = int64(3)
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := goodDelivery(tt.kind)
			if tt.edit != nil {
				tt.edit(&d)
			}
			_, err := decode(tt.kind, d, 100)
			switch {
			case tt.errHas == "" && err != nil:
				t.Fatalf("got error %v, want none", err)
			case tt.errHas != "" && err == nil:
				t.Fatalf("got no error, want one with %q", tt.errHas)
			case tt.errHas != "" && !strings.Contains(err.Error(), tt.errHas):
				t.Fatalf("got error %q, want one with %q", err, tt.errHas)
			case err != nil:
				var mf *malformed
				if !errors.As(err, &mf) {
					t.Fatalf("got %T, want *malformed", err)
				}
			}
		})
	}
}

func TestDecodeFields(t *testing.T) {
	d := goodDelivery(typeCommand)
	d.Headers["x-delivery-count"] = int64(2)
	d.Redelivered = true
	d.Headers["X-Multi"] = []any{"a", "b"}
	d.Headers[HeaderRedelivered] = "true"
	d.ContentType = "application/json"
	d.Timestamp = time.Unix(100, 0)
	e, err := decode(typeCommand, d, 100)
	if err != nil {
		t.Fatal(err)
	}
	if e.attempt != 3 || !e.redelivered || e.name != "resize" || e.origin != "alpha" || e.msgID != "m1" || !e.sent.Equal(d.Timestamp) {
		t.Errorf("got %+v", e)
	}
	want := nats.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}}
	if !reflect.DeepEqual(e.header, want) {
		t.Errorf("header: got %v, want %v", e.header, want)
	}
	d = goodDelivery(typeCommand)
	d.Redelivered = true
	if e, _ := decode(typeCommand, d, 100); e.attempt != 2 || !e.redelivered {
		t.Errorf("classic redelivery: got attempt %d redelivered %v, want 2 true", e.attempt, e.redelivered)
	}
}

func TestHeadersRoundTrip(t *testing.T) {
	in := nats.Header{
		"Content-Type":     {"text/plain"},
		"Content-Encoding": {"gzip"},
		"X-Trace":          {"abc"},
		"X-Multi":          {"1", "2"},
		HeaderOrigin:       {"spoofed"},
		"Status":           {"503"},
	}
	hdr, err := callerHeaders(in)
	if err != nil {
		t.Fatal(err)
	}
	out := &outgoing{kind: typeEvent, key: "evt.t", msgID: "m", header: hdr, body: []byte("x")}
	p, _ := out.publishing("alpha", "guest", nil)
	if p.ContentType != "text/plain" || p.ContentEncoding != "gzip" {
		t.Errorf("properties: got %q %q", p.ContentType, p.ContentEncoding)
	}
	if p.Headers[HeaderOrigin] != "alpha" {
		t.Errorf("origin: got %v, want alpha (a caller cannot set it)", p.Headers[HeaderOrigin])
	}
	if err := p.Headers.Validate(); err != nil {
		t.Fatalf("headers do not validate: %v", err)
	}
	d := delivery{Type: typeEvent, RoutingKey: "evt.t", MessageId: "m", Headers: p.Headers,
		ContentType: p.ContentType, ContentEncoding: p.ContentEncoding, Body: p.Body}
	e, err := decode(typeEvent, d, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := nats.Header{"Content-Type": {"text/plain"}, "Content-Encoding": {"gzip"}, "X-Trace": {"abc"}, "X-Multi": {"1", "2"}}
	if !reflect.DeepEqual(e.header, want) {
		t.Errorf("got %v, want %v", e.header, want)
	}
}

// TestMQTTHeadersStayOnTheirNode: the embedded server's MQTT headers
// (Nmqtt-Pub marks a publish's QoS; a QoS 1 MQTT subscriber skips a
// message so marked, waiting for the server's stored copy) neither leave
// with a local program's message nor come in with a peer's: a peer that
// sent them could make every QoS 1 MQTT subscriber of the mesh miss its
// events (or every QoS 1 MQTT handler of a stage its commands). The
// control: the other headers pass both ways.
func TestMQTTHeadersStayOnTheirNode(t *testing.T) {
	in := nats.Header{"Nmqtt-Pub": {"1"}, "nmqtt-subject": {"evt.x"}, "X-Trace": {"abc"}}
	hdr, err := callerHeaders(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := (nats.Header{"X-Trace": {"abc"}}); !reflect.DeepEqual(hdr, want) {
		t.Errorf("a local program's headers: got %v, want %v", hdr, want)
	}
	e := &envelope{header: in, body: []byte("x")} // as a peer sealed them
	m := e.natsMsg("evt.x", map[string]string{HeaderOrigin: "peer"})
	if m.Header.Get("Nmqtt-Pub") != "" || m.Header.Get("Nmqtt-Subject") != "" || m.Header.Get("X-Trace") != "abc" || m.Header.Get(HeaderOrigin) != "peer" {
		t.Errorf("a peer's event republished here: headers %v, want X-Trace and the origin only", m.Header)
	}
	c := (&envelope{header: in, body: []byte("x"), msgID: "id1", origin: "peer", attempt: 1}).commandMsg("mail", false)
	if c.Header.Get("Nmqtt-Pub") != "" || c.Header.Get("Nmqtt-Subject") != "" || c.Header.Get("X-Trace") != "abc" || c.Header.Get(HeaderOrigin) != "peer" {
		t.Errorf("a peer's command handed to a handler here: headers %v, want X-Trace and the command's own", c.Header)
	}
}

func TestCallerHeadersRejects(t *testing.T) {
	for name, h := range map[string]nats.Header{
		"CC":          {"CC": {"evt.x"}},
		"line break":  {"X-A": {"a\nb"}},
		"key space":   {"a b": {"x"}},
		"key too big": {strings.Repeat("k", wire.MaxHeaderKey+1): {"x"}},
		"too big":     {"X-A": {strings.Repeat("x", maxHeaderBytes+1)}},
	} {
		if _, err := callerHeaders(h); !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: got %v, want ErrBadInput", name, err)
		}
	}
}

// FuzzDecodeDelivery feeds arbitrary deliveries (headers built from the
// fuzz input, with every AMQP field type) to decode: it must never panic,
// and an accepted envelope must be publishable again.
func FuzzDecodeDelivery(f *testing.F) {
	f.Add(uint8(2), "cmd.resize", "m1", "", "", "command", []byte("\x01k\x00alpha"), []byte("body"), false)
	f.Add(uint8(0), "to.b.req.echo", "m1", "c1", "node.a.replies", "request", []byte("\x02Meshbox-Timeout\x001s"), []byte{}, true)
	f.Add(uint8(3), "evt.x", "m", "", "", "event", []byte{0xff, 0, 1, 2, 3}, []byte("x"), false)
	kinds := []string{typeRequest, typeReply, typeCommand, typeEvent, typeSystem}
	f.Fuzz(func(t *testing.T, k uint8, key, msgID, corrID, replyTo, typ string, hdrs, body []byte, redelivered bool) {
		kind := kinds[int(k)%len(kinds)]
		d := delivery{Type: typ, RoutingKey: key, MessageId: msgID, CorrelationId: corrID, ReplyTo: replyTo,
			Headers: fuzzTable(hdrs), Body: body, Redelivered: redelivered}
		e, err := decode(kind, d, 1<<16)
		if err != nil {
			var mf *malformed
			if !errors.As(err, &mf) {
				t.Fatalf("error %T is not *malformed", err)
			}
			return
		}
		out := &outgoing{kind: kind, header: e.header, body: e.body}
		p, _ := out.publishing("n", "guest", nil)
		if err := p.Headers.Validate(); err != nil {
			t.Fatalf("accepted headers do not validate: %v", err)
		}
		_ = e.natsMsg("evt.x", map[string]string{HeaderOrigin: "n"})
	})
}

// fuzzTable builds an AMQP table from bytes: a type byte, a key, and a value
// of that type, repeated.
func fuzzTable(b []byte) amqp.Table {
	t := amqp.Table{}
	keys := []string{HeaderOrigin, HeaderTimeout, HeaderRedelivered, "x-delivery-count", "x-death", "X-A", "Status", "bad key", "Content-Type"}
	for len(b) >= 2 {
		typ, ki := b[0], int(b[1])
		b = b[2:]
		var key string
		if ki < len(keys) {
			key = keys[ki]
		} else {
			n := min(ki%16, len(b))
			key, b = string(b[:n]), b[n:]
		}
		n := 0
		if len(b) > 0 {
			n = min(int(b[0]), len(b)-1)
			b = b[1:]
		}
		raw := b[:n]
		b = b[n:]
		switch typ % 8 {
		case 0:
			t[key] = string(raw)
		case 1:
			var v int64
			if len(raw) >= 8 {
				v = int64(binary.BigEndian.Uint64(raw))
			}
			t[key] = v
		case 2:
			t[key] = int32(len(raw)) - 3
		case 3:
			t[key] = []any{string(raw), int16(1)}
		case 4:
			t[key] = []any{string(raw)}
		case 5:
			t[key] = amqp.Table{"k": string(raw)}
		case 6:
			t[key] = raw
		case 7:
			t[key] = len(raw)%2 == 0
		}
	}
	return t
}
