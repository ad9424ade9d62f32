package localnats

import (
	"bufio"
	"bytes"
	"log/slog"
	"testing"

	"github.com/meshbox/meshbox/appliance/programs"
)

func TestMQTTConnectRoundTrip(t *testing.T) {
	in := mqttConnectPacket{protocol: "MQTT", level: 4, flags: mqttConnFlagUsername | mqttConnFlagPassword | mqttConnFlagWill | mqttConnFlagClean,
		keepAlive: 60, clientID: "plug-1", willTopic: "evt/plug/lwt", willMsg: []byte("gone"), username: "plug", password: "secret"}
	raw := appendMQTTPacket(nil, in.encode())
	var buf []byte
	p, err := readMQTTPacket(bufio.NewReader(bytes.NewReader(raw)), &buf)
	if err != nil || p.kind() != mqttConnect {
		t.Fatalf("read: %v, kind %d", err, p.kind())
	}
	out, err := parseMQTTConnect(p.body)
	if err != nil {
		t.Fatal(err)
	}
	if out.clientID != in.clientID || out.username != in.username || out.password != in.password ||
		out.willTopic != in.willTopic || string(out.willMsg) != "gone" || !out.clean() || out.keepAlive != 60 {
		t.Errorf("got %+v, want %+v", out, in)
	}
	if _, err := parseMQTTConnect(p.body[:len(p.body)-1]); err == nil {
		t.Errorf("a short CONNECT parsed")
	}
	pub, err := parseMQTTPublish(publishPacket("evt/a", []byte("xyz"), 7, true))
	if err != nil || pub.topic != "evt/a" || pub.qos != 1 || pub.id != 7 || !pub.retain || pub.payload != 3 {
		t.Errorf("publish: got %+v, %v", pub, err)
	}
}

func TestMQTTBounds(t *testing.T) {
	b := newMQTTBounds(t.TempDir(), slog.New(slog.DiscardHandler))
	lim := programs.MQTTLimits{RetainedMsgs: 2, RetainedBytes: 10, Inflight: 2, Sessions: 2}
	known := func(string) bool { return true }
	a1, a2, x := &doorConn{}, &doorConn{}, &doorConn{}
	for _, tc := range []struct {
		prog, id   string
		persistent bool
		c          *doorConn
		want       string
	}{
		{"a", "a-1", true, a1, ""},
		{"b", "a-1", false, x, RefusedClientID},
		{"a", "a-2", false, a2, ""},
		{"a", "a-3", false, x, RefusedSessions},
		{"a", "a-1", true, x, ""}, // its own, again
	} {
		if got := b.claim(tc.prog, tc.id, tc.persistent, tc.c, lim, known); got != tc.want {
			t.Errorf("claim %s by %s: got %q, want %q", tc.id, tc.prog, got, tc.want)
		}
	}
	b.release("a-2", a2) // a clean session ends with its connection
	if got := b.claim("b", "a-2", false, x, lim, known); got != "" {
		t.Errorf("a-2 after its clean session ended: got %q, want it free", got)
	}
	b.release("a-1", a1) // a1 no longer uses it (x took it over): no change
	if got := b.claim("b", "a-1", false, x, lim, known); got != RefusedClientID {
		t.Errorf("a stored session's client ID: got %q, want %q", got, RefusedClientID)
	}
	if got := newMQTTBounds(b.path[:len(b.path)-len(mqttSessionsFile)], slog.New(slog.DiscardHandler)).claim("b", "a-1", false, x, lim, known); got != RefusedClientID {
		t.Errorf("a stored session's client ID after a restart: got %q, want %q", got, RefusedClientID)
	}

	for _, tc := range []struct {
		prog, topic string
		size        int64
		want        string
	}{
		{"a", "t/1", 4, ""},
		{"a", "t/2", 4, ""},
		{"a", "t/3", 1, RefusedRetainedMsgs},
		{"a", "t/2", 7, RefusedRetainedBytes},
		{"a", "t/2", 6, ""}, // replaces its own
		{"a", "t/1", 0, ""}, // a clear
		{"a", "t/3", 1, ""},
	} {
		if got := b.retain(tc.prog, tc.topic, tc.size, lim); got != tc.want {
			t.Errorf("retain %s %d by %s: got %q, want %q", tc.topic, tc.size, tc.prog, got, tc.want)
		}
	}
	b.heardRetained("t/3", "", 5, true) // another node's retain took the topic
	if got := b.retain("a", "t/4", 4, lim); got != "" {
		t.Errorf("retain after another node took t/3: got %q, want it taken", got)
	}

	for i, want := range []bool{true, true, true, false} {
		pi := uint16(i + 1)
		if i == 2 {
			pi = 2 // resent
		}
		if got := b.holdQoS2("a-1", pi, lim); got != want {
			t.Errorf("QoS 2 publish %d: got %v, want %v", pi, got, want)
		}
	}
	b.releaseQoS2("a-1", 1)
	if !b.holdQoS2("a-1", 9, lim) {
		t.Errorf("QoS 2 publish after a release: refused")
	}
}
