package localnats

import (
	"bytes"
	"errors"
	"testing"

	"github.com/meshbox/meshbox/appliance/programs"
)

func TestRetainedRoundTrip(t *testing.T) {
	for _, r := range []Retained{
		{Subject: "evt.homeassistant.sensor.plug1.config", Payload: []byte(`{"name":"plug1"}`), QoS: 1, Origin: MeshOrigin, Source: "node:alpha"},
		{Subject: "evt.a", Payload: nil, QoS: 0, Origin: MeshOrigin},
		{Subject: "evt.b", Payload: []byte{0, 1, 2}, QoS: 2},
	} {
		m := EncodeRetained(r)
		if want := RetainedSubjectPrefix + r.Subject; m.Subject != want {
			t.Errorf("subject: got %q, want %q", m.Subject, want)
		}
		got, err := DecodeRetained(m.Subject, m.Header, m.Data)
		if err != nil {
			t.Fatalf("decode %+v: %v", r, err)
		}
		if got.Subject != r.Subject || !bytes.Equal(got.Payload, r.Payload) || got.QoS != r.QoS || got.Origin != r.Origin || got.Source != r.Source {
			t.Errorf("got %+v, want %+v", got, r)
		}
		// The server's delete marker on a clear, the retain bit always.
		if f := m.Header.Get(retainedHdrFlags); (len(r.Payload) == 0) != (f[0] == '-') {
			t.Errorf("flags %q for a payload of %d bytes", f, len(r.Payload))
		}
	}
	if _, err := DecodeRetained("evt.x", nil, nil); !errors.Is(err, ErrNotRetained) {
		t.Errorf("a subject outside the store: %v, want ErrNotRetained", err)
	}
}

func TestRetainAllowed(t *testing.T) {
	progs := []programs.Program{
		{Name: "sensor", MQTT: true, Publish: []string{"homeassistant.>"}},
		{Name: "nosy", MQTT: true, Publish: []string{"garden.>"}},
	}
	var closed, open Rights
	closed.set(progs, false)
	open.set(progs, true)
	for _, tt := range []struct {
		name, source, subject string
		closed, open          bool // allowed
	}{
		{"its own topic", "sensor", "evt.homeassistant.sensor.x.config", true, true},
		{"another's topic", "nosy", "evt.homeassistant.sensor.x.config", false, false},
		{"no program", "ghost", "evt.homeassistant.sensor.x.config", false, false},
		{"without a credential", "", "evt.homeassistant.sensor.x.config", false, true},
		{"a wildcard", "sensor", "evt.homeassistant.>", false, false},
	} {
		for _, c := range []struct {
			r    *Rights
			want bool
		}{{&closed, tt.closed}, {&open, tt.open}} {
			err := c.r.RetainAllowed(tt.source, tt.subject)
			if (err == nil) != c.want || (err != nil && !errors.Is(err, ErrRetainRefused)) {
				t.Errorf("%s: RetainAllowed(%q, %q) = %v, want allowed %v", tt.name, tt.source, tt.subject, err, c.want)
			}
		}
	}
}
