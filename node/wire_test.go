package node

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDecodeMessage(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	enc := func(m Message) []byte {
		b, err := EncodeMessage(&m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	hello := Message{V: 1, Type: TypeHello, Node: "B", StartedAt: at, Seq: 1, Version: "1.2.3", Revision: 7,
		Capabilities: []string{"z", "echo", "z", "image.resize"}, Stages: []string{"thumb"}, HeartbeatMS: 5000}
	with := func(mod func(*Message)) []byte {
		m := hello
		mod(&m)
		return enc(m)
	}
	tests := []struct {
		name   string
		key    string
		body   []byte
		origin string
		want   error  // nil: accepted
		field  string // the field a rejection names
	}{
		{"hello", "hello", enc(hello), "B", nil, ""},
		{"hello without origin", "hello", enc(hello), "", nil, ""},
		{"query", "query", enc(Message{V: 1, Type: TypeQuery, Node: "B", StartedAt: at}), "B", nil, ""},
		{"addressed query", "query", enc(Message{V: 1, Type: TypeQuery, Node: "B", To: "A", StartedAt: at}), "B", nil, ""},
		{"info", "info", with(func(m *Message) { m.Type, m.To = TypeInfo, "A" }), "B", nil, ""},
		{"update", "update", with(func(m *Message) { m.Type = TypeUpdate }), "B", nil, ""},
		{"update to nothing", "update", with(func(m *Message) { m.Type, m.Capabilities, m.Stages = TypeUpdate, nil, nil }), "B", nil, ""},
		{"heartbeat", "heartbeat", enc(Message{V: 1, Type: TypeHeartbeat, Node: "B", StartedAt: at, Hash: "00ff"}), "B", nil, ""},
		{"bye", "bye", enc(Message{V: 1, Type: TypeBye, Node: "B", StartedAt: at}), "B", nil, ""},
		{"hello from a version 2 node", "hello", with(func(m *Message) { m.Proto = 2 }), "B", nil, ""},
		{"hello as version 2", "hello", with(func(m *Message) { m.V, m.Proto = 2, 2 }), "B", nil, ""},
		{"hello from a later node", "hello", with(func(m *Message) { m.Proto = 7 }), "B", nil, ""},
		{"ping", "ping", enc(Message{V: 2, Type: TypePing, Node: "B", To: "A", StartedAt: at, Proto: 2}), "B", nil, ""},
		{"gone", "gone", enc(Message{V: 2, Type: TypeGone, Node: "B", Peer: "C", StartedAt: at, Proto: 2}), "B", nil, ""},
		{"unknown fields ignored", "bye", []byte(`{"v":1,"type":"bye","node":"B","started_at":"2030-01-02T03:04:05Z","future":true}`), "", nil, ""},

		{"too large", "hello", append(enc(hello), make([]byte, MaxMessageBytes)...), "", ErrTooLarge, ""},
		{"not json", "hello", []byte("{"), "", ErrMalformed, ""},
		{"empty", "hello", nil, "", ErrMalformed, ""},
		{"two values", "hello", append(enc(hello), enc(hello)...), "", ErrMalformed, ""},
		{"wrong json type", "hello", []byte(`{"v":"1"}`), "", ErrMalformed, ""},
		{"version 0", "hello", with(func(m *Message) { m.V = 0 }), "", ErrVersion, "v"},
		{"a later version", "hello", with(func(m *Message) { m.V = ProtocolVersion + 1 }), "", ErrVersion, "v"},
		{"ping as version 1", "ping", enc(Message{V: 1, Type: TypePing, Node: "B", To: "A", StartedAt: at}), "", ErrUnknownType, "type"},
		{"gone as version 1", "gone", enc(Message{V: 1, Type: TypeGone, Node: "B", Peer: "C", StartedAt: at}), "", ErrUnknownType, "type"},
		{"ping to nobody", "ping", enc(Message{V: 2, Type: TypePing, Node: "B", StartedAt: at}), "", ErrBadField, "to"},
		{"addressed gone", "gone", enc(Message{V: 2, Type: TypeGone, Node: "B", To: "A", Peer: "C", StartedAt: at}), "", ErrBadField, "to"},
		{"gone naming nobody", "gone", enc(Message{V: 2, Type: TypeGone, Node: "B", StartedAt: at}), "", ErrBadField, "peer"},
		{"gone naming a bad name", "gone", enc(Message{V: 2, Type: TypeGone, Node: "B", Peer: "a.b", StartedAt: at}), "", ErrBadName, "peer"},
		{"peer on a heartbeat", "heartbeat", enc(Message{V: 1, Type: TypeHeartbeat, Node: "B", Peer: "C", StartedAt: at}), "", ErrBadField, "peer"},
		{"proto below v", "ping", enc(Message{V: 2, Type: TypePing, Node: "B", To: "A", StartedAt: at, Proto: 1}), "", ErrBadField, "proto"},
		{"unknown type", "gossip", with(func(m *Message) { m.Type = "gossip" }), "", ErrUnknownType, "type"},
		{"no node", "hello", with(func(m *Message) { m.Node = "" }), "", ErrBadName, "node"},
		{"dotted node", "hello", with(func(m *Message) { m.Node = "a.b" }), "", ErrBadName, "node"},
		{"long node", "hello", with(func(m *Message) { m.Node = strings.Repeat("n", 65) }), "", ErrBadName, "node"},
		{"origin", "hello", enc(hello), "C", ErrOrigin, "node"},
		{"bad to", "info", with(func(m *Message) { m.Type, m.To = TypeInfo, "a>" }), "", ErrBadName, "to"},
		{"info to nobody", "info", with(func(m *Message) { m.Type = TypeInfo }), "", ErrBadField, "to"},
		{"addressed hello", "hello", with(func(m *Message) { m.To = "A" }), "", ErrBadField, "to"},
		{"key for another type", "bye", enc(hello), "", ErrKeyMismatch, ""},
		{"no started_at", "hello", with(func(m *Message) { m.StartedAt = time.Time{} }), "", ErrBadField, "started_at"},
		{"control char in version", "hello", with(func(m *Message) { m.Version = "1\x00" }), "", ErrBadField, "version"},
		{"long version", "hello", with(func(m *Message) { m.Version = strings.Repeat("1", 65) }), "", ErrBadField, "version"},
		{"negative revision", "hello", with(func(m *Message) { m.Revision = -1 }), "", ErrBadField, "revision"},
		{"upper-case hash", "hello", with(func(m *Message) { m.Hash = "ABCD" }), "", ErrBadField, "hash"},
		{"long hash", "hello", with(func(m *Message) { m.Hash = strings.Repeat("a", 65) }), "", ErrBadField, "hash"},
		{"heartbeat too fast", "hello", with(func(m *Message) { m.HeartbeatMS = 1 }), "", ErrBadField, "heartbeat_ms"},
		{"heartbeat too slow", "hello", with(func(m *Message) { m.HeartbeatMS = maxHeartbeatMS + 1 }), "", ErrBadField, "heartbeat_ms"},
		{"lists on a bye", "bye", enc(Message{V: 1, Type: TypeBye, Node: "B", StartedAt: at, Capabilities: []string{"x"}}), "", ErrBadField, "capabilities"},
		{"too many capabilities", "hello", with(func(m *Message) { m.Capabilities = make([]string, MaxCapabilities+1) }), "", ErrTooMany, "capabilities"},
		{"too many stages", "hello", with(func(m *Message) { m.Stages = make([]string, MaxStages+1) }), "", ErrTooMany, "stages"},
		{"wildcard capability", "hello", with(func(m *Message) { m.Capabilities = []string{"a.*"} }), "", ErrBadName, "capabilities"},
		{"empty stage", "hello", with(func(m *Message) { m.Stages = []string{""} }), "", ErrBadName, "stages"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := DecodeMessage(tt.key, tt.body, tt.origin)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("got %v, want the message accepted", err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v (message %+v), want %v", err, m, tt.want)
			}
			var we *WireError
			if !errors.As(err, &we) || we.Field != tt.field || we.Reason == "" {
				t.Fatalf("got %#v, want a WireError naming field %q with a reason", err, tt.field)
			}
		})
	}

	m, err := DecodeMessage("hello", enc(hello), "B")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"echo", "image.resize", "z"}; !slices.Equal(m.Capabilities, want) {
		t.Fatalf("capabilities: got %v, want sorted without duplicates %v", m.Capabilities, want)
	}
	if m.Hash != HostHash(m.Capabilities, m.Stages) {
		t.Fatalf("hash of a record without one: got %q, want %q", m.Hash, HostHash(m.Capabilities, m.Stages))
	}
}

func TestMessageWireFormat(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	m := Message{V: 1, Type: TypeInfo, Node: "B", To: "A", StartedAt: at, Seq: 3, Version: "1.0", Revision: 9,
		Capabilities: []string{"echo"}, Stages: []string{"thumb"}, Hash: "ab", HeartbeatMS: 5000}
	body, err := EncodeMessage(&m)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"v", "type", "node", "to", "started_at", "seq", "version", "revision", "capabilities", "stages", "hash", "heartbeat_ms"} {
		if _, ok := got[k]; !ok {
			t.Errorf("encoded message lacks field %q: %s", k, body)
		}
	}
	if got["started_at"] != "2030-01-02T03:04:05Z" {
		t.Errorf("started_at: got %v, want RFC 3339", got["started_at"])
	}
}

func TestHostHash(t *testing.T) {
	a := HostHash([]string{"b", "a"}, []string{"s"})
	if b := HostHash([]string{"a", "b", "a"}, []string{"s"}); a != b {
		t.Fatalf("hash depends on order or duplicates: %s != %s", a, b)
	}
	if c := HostHash([]string{"a", "b"}, nil); a == c {
		t.Fatal("hash ignores stages")
	}
	if d := HostHash([]string{"s"}, []string{"a", "b"}); a == d {
		t.Fatal("hash confuses capabilities and stages")
	}
	if len(a) != 32 || !isHex(a) {
		t.Fatalf("hash %q: want 32 lower-case hex digits", a)
	}
}

func TestValidCapabilityName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"echo", true},
		{"image.resize", true},
		{"a-b_c.D9", true},
		{strings.Repeat("a", MaxCapNameLen), true},
		{strings.Repeat("a", MaxCapNameLen+1), false},
		{"", false},
		{".a", false},
		{"a.", false},
		{"a..b", false},
		{"*", false},
		{"a.>", false},
		{"a b", false},
		{"é", false},
		{"a/b", false},
	}
	for _, tt := range tests {
		if got := ValidCapabilityName(tt.name); got != tt.ok {
			t.Errorf("ValidCapabilityName(%q): got %v, want %v", tt.name, got, tt.ok)
		}
	}
}

func TestLocalNames(t *testing.T) {
	tests := []struct {
		name                  string
		subjects              []string
		caps, stages, skipped []string
	}{
		{"none", nil, nil, nil, nil},
		{"caps and stages", []string{"cap.b", "cap.a", "work.w", "cap.a", "evt.x", "_INBOX.1", "$SRV.PING"}, []string{"a", "b"}, []string{"w"}, nil},
		{"multi-token", []string{"cap.image.resize"}, []string{"image.resize"}, nil, nil},
		{"wildcards do not host", []string{"cap.*", "cap.>", ">", "cap.a.*", "work.>", "*.echo"}, nil, nil, nil},
		{"bare prefix", []string{"cap.", "work."}, nil, nil, nil},
		{"invalid names skipped", []string{"cap.a..b", "cap.é", "work.x"}, nil, []string{"x"}, []string{"cap.a..b", "cap.é"}},
		{"node-addressed subjects are not local hosts", []string{"node.A.cap.echo"}, nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caps, stages, skipped := localNames(tt.subjects)
			if !slices.Equal(caps, tt.caps) || !slices.Equal(stages, tt.stages) || !slices.Equal(skipped, tt.skipped) {
				t.Fatalf("got caps %v stages %v skipped %v, want %v %v %v", caps, stages, skipped, tt.caps, tt.stages, tt.skipped)
			}
		})
	}
}

// FuzzDecodeMessage checks that no input crashes the decoder and that an
// accepted message survives a round trip.
func FuzzDecodeMessage(f *testing.F) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, m := range []Message{
		{V: 1, Type: TypeHello, Node: "B", StartedAt: at, Capabilities: []string{"a", "b.c"}, Stages: []string{"s"}},
		{V: 1, Type: TypeInfo, Node: "B", To: "A", StartedAt: at, Hash: "ab"},
		{V: 1, Type: TypeHeartbeat, Node: "B", StartedAt: at, HeartbeatMS: 100},
	} {
		b, _ := EncodeMessage(&m)
		f.Add(m.Type, b, "B")
	}
	f.Add("hello", []byte(`{"v":1,"type":"hello","node":"x","capabilities":[null]}`), "")
	f.Fuzz(func(t *testing.T, key string, body []byte, origin string) {
		m, err := DecodeMessage(key, body, origin)
		if err != nil {
			var we *WireError
			if !errors.As(err, &we) || we.Reason == "" {
				t.Fatalf("rejection %v is not a WireError with a reason", err)
			}
			return
		}
		again, err := EncodeMessage(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeMessage(m.Type, again, m.Node); err != nil {
			t.Fatalf("accepted message does not decode again: %v", err)
		}
	})
}
