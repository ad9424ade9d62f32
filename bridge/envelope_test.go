package bridge

import (
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/internal/wire"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

func goodDelivery(kind string) codec.Delivery {
	d := codec.Delivery{Type: kind, Headers: amqp.Table{codec.HeaderOrigin: "alpha"}, MessageId: "m1", Body: []byte("b")}
	switch kind {
	case codec.TypeRequest:
		d.RoutingKey, d.CorrelationId, d.ReplyTo = "to.beta.req.echo", "c1", "node.alpha.replies"
	case codec.TypeReply:
		d.CorrelationId = "c1"
	case codec.TypeCommand:
		d.RoutingKey = "cmd.resize"
	case codec.TypeEvent:
		d.RoutingKey = "evt.order.created"
	case codec.TypeSystem:
		d.RoutingKey = "sys.hello"
	}
	return d
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name   string
		kind   string
		edit   func(*codec.Delivery)
		errHas string // "" = valid
	}{
		{"request", codec.TypeRequest, nil, ""},
		{"request to the queue", codec.TypeRequest, func(d *codec.Delivery) {
			d.RoutingKey = "node.beta.requests"
			d.Headers[codec.HeaderCapability] = "echo.v2"
		}, ""},
		{"request to the queue without capability", codec.TypeRequest, func(d *codec.Delivery) { d.RoutingKey = "node.beta.requests" }, codec.HeaderCapability},
		{"request bad capability header", codec.TypeRequest, func(d *codec.Delivery) {
			d.RoutingKey = "node.beta.requests"
			d.Headers[codec.HeaderCapability] = "a.*"
		}, "not a capability name"},
		{"reply", codec.TypeReply, func(d *codec.Delivery) { delete(d.Headers, codec.HeaderOrigin) }, ""},
		{"command", codec.TypeCommand, nil, ""},
		{"event", codec.TypeEvent, nil, ""},
		{"system", codec.TypeSystem, nil, ""},
		{"system addressed", codec.TypeSystem, func(d *codec.Delivery) { d.RoutingKey = "to.alpha.sys.x" }, ""},
		{"wrong type", codec.TypeCommand, func(d *codec.Delivery) { d.Type = "event" }, "type"},
		{"no type", codec.TypeEvent, func(d *codec.Delivery) { d.Type = "" }, "type"},
		{"request no correlation id", codec.TypeRequest, func(d *codec.Delivery) { d.CorrelationId = "" }, "correlation id"},
		{"request reply-to elsewhere", codec.TypeRequest, func(d *codec.Delivery) { d.ReplyTo = "some.queue" }, "reply-to"},
		{"request bad key", codec.TypeRequest, func(d *codec.Delivery) { d.RoutingKey = "cmd.x" }, "routing key"},
		{"request bad timeout", codec.TypeRequest, func(d *codec.Delivery) { d.Headers[codec.HeaderTimeout] = "soon" }, "duration"},
		{"request negative timeout", codec.TypeRequest, func(d *codec.Delivery) { d.Headers[codec.HeaderTimeout] = "-1s" }, "duration"},
		{"command no id", codec.TypeCommand, func(d *codec.Delivery) { d.MessageId = "" }, "message id"},
		{"command id with space", codec.TypeCommand, func(d *codec.Delivery) { d.MessageId = "a b" }, "message id"},
		{"command wildcard key", codec.TypeCommand, func(d *codec.Delivery) { d.RoutingKey = "cmd.*" }, "routing key"},
		{"event no origin", codec.TypeEvent, func(d *codec.Delivery) { delete(d.Headers, codec.HeaderOrigin) }, codec.HeaderOrigin},
		{"event origin not a string", codec.TypeEvent, func(d *codec.Delivery) { d.Headers[codec.HeaderOrigin] = int32(5) }, "want string"},
		{"event origin invalid", codec.TypeEvent, func(d *codec.Delivery) { d.Headers[codec.HeaderOrigin] = "a.b" }, codec.HeaderOrigin},
		{"header int", codec.TypeEvent, func(d *codec.Delivery) { d.Headers["X-N"] = int64(1) }, "want string"},
		{"header table", codec.TypeEvent, func(d *codec.Delivery) { d.Headers["X-T"] = amqp.Table{"a": "b"} }, "want string"},
		{"header array of ints", codec.TypeEvent, func(d *codec.Delivery) { d.Headers["X-A"] = []any{int64(1)} }, "want strings"},
		{"header bad key", codec.TypeEvent, func(d *codec.Delivery) { d.Headers["a b"] = "x" }, "not allowed"},
		{"header status", codec.TypeEvent, func(d *codec.Delivery) { d.Headers["Status"] = "503" }, "not allowed"},
		{"header line break", codec.TypeEvent, func(d *codec.Delivery) { d.Headers["X-A"] = "a\r\nb: c" }, "line break"},
		{"content type line break", codec.TypeEvent, func(d *codec.Delivery) { d.ContentType = "a\nb" }, "line break"},
		{"headers too big", codec.TypeEvent, func(d *codec.Delivery) { d.Headers["X-Big"] = strings.Repeat("x", codec.MaxHeaderBytes) }, "exceed"},
		{"delivery count not a number", codec.TypeCommand, func(d *codec.Delivery) { d.Redelivered = true; d.Headers["x-delivery-count"] = "1" }, "integer"},
		{"payload too large", codec.TypeEvent, func(d *codec.Delivery) { d.Body = make([]byte, 101) }, "exceeds"},
		{"broker headers ignored", codec.TypeEvent, func(d *codec.Delivery) {
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
			_, err := codec.Decode(tt.kind, d, 100)
			switch {
			case tt.errHas == "" && err != nil:
				t.Fatalf("got error %v, want none", err)
			case tt.errHas != "" && err == nil:
				t.Fatalf("got no error, want one with %q", tt.errHas)
			case tt.errHas != "" && !strings.Contains(err.Error(), tt.errHas):
				t.Fatalf("got error %q, want one with %q", err, tt.errHas)
			case err != nil:
				var mf *codec.Malformed
				if !errors.As(err, &mf) {
					t.Fatalf("got %T, want *malformed", err)
				}
			}
		})
	}
}

func TestDecodeFields(t *testing.T) {
	d := goodDelivery(codec.TypeCommand)
	d.Headers["x-delivery-count"] = int64(2)
	d.Redelivered = true
	d.Headers["X-Multi"] = []any{"a", "b"}
	d.Headers[codec.HeaderRedelivered] = "true"
	d.ContentType = "application/json"
	d.Timestamp = time.Unix(100, 0)
	e, err := codec.Decode(codec.TypeCommand, d, 100)
	if err != nil {
		t.Fatal(err)
	}
	if e.Attempt != 3 || !e.Redelivered || e.Name != "resize" || e.Origin != "alpha" || e.MsgID != "m1" || !e.Sent.Equal(d.Timestamp) {
		t.Errorf("got %+v", e)
	}
	want := nats.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}}
	if !reflect.DeepEqual(e.Header, want) {
		t.Errorf("header: got %v, want %v", e.Header, want)
	}
	d = goodDelivery(codec.TypeCommand)
	d.Redelivered = true
	if e, _ := codec.Decode(codec.TypeCommand, d, 100); e.Attempt != 2 || !e.Redelivered {
		t.Errorf("classic redelivery: got attempt %d redelivered %v, want 2 true", e.Attempt, e.Redelivered)
	}
}

func TestHeadersRoundTrip(t *testing.T) {
	in := nats.Header{
		"Content-Type":     {"text/plain"},
		"Content-Encoding": {"gzip"},
		"X-Trace":          {"abc"},
		"X-Multi":          {"1", "2"},
		codec.HeaderOrigin: {"spoofed"},
		"Status":           {"503"},
	}
	hdr, err := codec.CallerHeaders(in)
	if err != nil {
		t.Fatal(err)
	}
	out := &codec.Outgoing{Kind: codec.TypeEvent, Key: "evt.t", MsgID: "m", Header: hdr, Body: []byte("x")}
	p, _ := out.Publishing("alpha", "guest", nil)
	if p.ContentType != "text/plain" || p.ContentEncoding != "gzip" {
		t.Errorf("properties: got %q %q", p.ContentType, p.ContentEncoding)
	}
	if p.Headers[codec.HeaderOrigin] != "alpha" {
		t.Errorf("origin: got %v, want alpha (a caller cannot set it)", p.Headers[codec.HeaderOrigin])
	}
	if err := p.Headers.Validate(); err != nil {
		t.Fatalf("headers do not validate: %v", err)
	}
	if got, want := p.Headers["BCC"], []any{"evo.alpha.t"}; !reflect.DeepEqual(got, want) {
		t.Errorf("BCC: got %v, want %v (the event's lane)", got, want)
	}
	delete(p.Headers, "BCC") // as the broker does before delivery
	d := codec.Delivery{Type: codec.TypeEvent, RoutingKey: "evt.t", MessageId: "m", Headers: p.Headers,
		ContentType: p.ContentType, ContentEncoding: p.ContentEncoding, Body: p.Body}
	e, err := codec.Decode(codec.TypeEvent, d, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := nats.Header{"Content-Type": {"text/plain"}, "Content-Encoding": {"gzip"}, "X-Trace": {"abc"}, "X-Multi": {"1", "2"}}
	if !reflect.DeepEqual(e.Header, want) {
		t.Errorf("got %v, want %v", e.Header, want)
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
	hdr, err := codec.CallerHeaders(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := (nats.Header{"X-Trace": {"abc"}}); !reflect.DeepEqual(hdr, want) {
		t.Errorf("a local program's headers: got %v, want %v", hdr, want)
	}
	e := &codec.Envelope{Header: in, Body: []byte("x")} // as a peer sealed them
	m := e.NatsMsg("evt.x", map[string]string{codec.HeaderOrigin: "peer"})
	if m.Header.Get("Nmqtt-Pub") != "" || m.Header.Get("Nmqtt-Subject") != "" || m.Header.Get("X-Trace") != "abc" || m.Header.Get(codec.HeaderOrigin) != "peer" {
		t.Errorf("a peer's event republished here: headers %v, want X-Trace and the origin only", m.Header)
	}
	c := (&codec.Envelope{Header: in, Body: []byte("x"), MsgID: "id1", Origin: "peer", Attempt: 1}).CommandMsg("mail", false)
	if c.Header.Get("Nmqtt-Pub") != "" || c.Header.Get("Nmqtt-Subject") != "" || c.Header.Get("X-Trace") != "abc" || c.Header.Get(codec.HeaderOrigin) != "peer" {
		t.Errorf("a peer's command handed to a handler here: headers %v, want X-Trace and the command's own", c.Header)
	}
}

func TestCallerHeadersRejects(t *testing.T) {
	for name, h := range map[string]nats.Header{
		"CC":          {"CC": {"evt.x"}},
		"line break":  {"X-A": {"a\nb"}},
		"key space":   {"a b": {"x"}},
		"key too big": {strings.Repeat("k", wire.MaxHeaderKey+1): {"x"}},
		"too big":     {"X-A": {strings.Repeat("x", codec.MaxHeaderBytes+1)}},
	} {
		if _, err := codec.CallerHeaders(h); !errors.Is(err, codec.ErrBadInput) {
			t.Errorf("%s: got %v, want ErrBadInput", name, err)
		}
	}
}

// FuzzDecodeDelivery feeds arbitrary deliveries (headers built from the
// fuzz input, with every AMQP field type) to decode: it must never panic,
// a refusal is malformed or a replay, and an accepted envelope must be
// publishable again.
func FuzzDecodeDelivery(f *testing.F) {
	f.Add(uint8(2), "cmd.resize", "m1", "", "", "command", []byte("\x01k\x00alpha"), []byte("body"), false)
	f.Add(uint8(0), "to.b.req.echo", "m1", "c1", "node.a.replies", "request", []byte("\x02Meshbox-Timeout\x001s"), []byte{}, true)
	f.Add(uint8(3), "evt.x", "m", "", "", "event", []byte{0xff, 0, 1, 2, 3}, []byte("x"), false)
	f.Add(uint8(2), "cmd.resize", "m1", "", "", "command", []byte("\x00\x04\x02q1"), []byte("body"), false) // x-death: a replay
	kinds := []string{codec.TypeRequest, codec.TypeReply, codec.TypeCommand, codec.TypeEvent, codec.TypeSystem}
	f.Fuzz(func(t *testing.T, k uint8, key, msgID, corrID, replyTo, typ string, hdrs, body []byte, redelivered bool) {
		kind := kinds[int(k)%len(kinds)]
		d := codec.Delivery{Type: typ, RoutingKey: key, MessageId: msgID, CorrelationId: corrID, ReplyTo: replyTo,
			Headers: fuzzTable(hdrs), Body: body, Redelivered: redelivered}
		e, err := codec.Decode(kind, d, 1<<16)
		if err != nil {
			// Refused as malformed, or as a replay when its headers say
			// the broker dead-lettered it (CheckDeaths): nothing else.
			var mf *codec.Malformed
			if !errors.As(err, &mf) && codec.AsReplay(err) == nil {
				t.Fatalf("error %T is neither *Malformed nor *ReplayError", err)
			}
			return
		}
		out := &codec.Outgoing{Kind: kind, Header: e.Header, Body: e.Body}
		p, _ := out.Publishing("n", "guest", nil)
		if err := p.Headers.Validate(); err != nil {
			t.Fatalf("accepted headers do not validate: %v", err)
		}
		_ = e.NatsMsg("evt.x", map[string]string{codec.HeaderOrigin: "n"})
	})
}

// fuzzTable builds an AMQP table from bytes: a type byte, a key, and a value
// of that type, repeated.
func fuzzTable(b []byte) amqp.Table {
	t := amqp.Table{}
	keys := []string{codec.HeaderOrigin, codec.HeaderTimeout, codec.HeaderRedelivered, "x-delivery-count", "x-death", "X-A", "Status", "bad key", "Content-Type"}
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
