package appliance

import (
	"bytes"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/appliance/localnats"
	"github.com/meshbox/meshbox/appliance/rows"
)

func TestRetainedRow(t *testing.T) {
	long := "evt." + strings.Repeat("a", rows.MaxRowLen)
	for _, tt := range []struct {
		subject string
		hashed  bool
	}{
		{"evt.homeassistant.sensor.plug1.config", false},
		{"evt.zigbee2mqtt.Living room lamp", true}, // a space: no row key
		{"=evt", true}, // '=' starts the hashed keys
		{long, true},
	} {
		row := retainedRow(tt.subject)
		if err := rows.ValidRow(row); err != nil {
			t.Errorf("retainedRow(%q) = %q: %v", tt.subject, row, err)
		}
		if hashed := strings.HasPrefix(row, "="); hashed != tt.hashed || (!hashed && row != tt.subject) {
			t.Errorf("retainedRow(%q) = %q, want hashed %v", tt.subject, row, tt.hashed)
		}
	}
}

// TestRetainedWriteRead: every write names the same fields (so that they
// converge to one write), and a row reads back as the message written.
func TestRetainedWriteRead(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 2*rows.MaxValueLen+5)
	for _, r := range []localnats.Retained{
		{Subject: "evt.a.b", Payload: []byte("on"), QoS: 1, Source: "sensor"},
		{Subject: "evt.a.b", Payload: big, QoS: 0, Source: "sensor"},
		{Subject: "evt.a.b"}, // a clear
	} {
		set, del := retainedWrite(r)
		if n := len(set) + len(del); n != 3+retainedParts {
			t.Errorf("a write of %d bytes names %d fields, want %d", len(r.Payload), n, 3+retainedParts)
		}
		row := retainedRow(r.Subject)
		if err := rows.CheckWrite(row, set, del); err != nil {
			t.Errorf("a write of %d bytes: %v", len(r.Payload), err)
		}
		cells := map[string]rows.Cell{}
		for f, v := range set {
			cells[f] = rows.Cell{Stamp: 1, Node: "alpha", Value: v}
		}
		for _, f := range del {
			cells[f] = rows.Cell{Stamp: 1, Node: "alpha", Deleted: true}
		}
		got, sc, err := retainedOf(row, cells)
		if err != nil || sc.Node != "alpha" || !sameRetained(got, r) || got.Source != r.Source {
			t.Errorf("read back %d bytes: got %d bytes qos %d (%v), want qos %d", len(r.Payload), len(got.Payload), got.QoS, err, r.QoS)
		}
	}
	// A row naming another row's subject, or no event, is refused.
	set, _ := retainedWrite(localnats.Retained{Subject: "evt.other", Payload: []byte("x")})
	cells := map[string]rows.Cell{}
	for f, v := range set {
		cells[f] = rows.Cell{Value: v}
	}
	if _, _, err := retainedOf("evt.a.b", cells); err == nil {
		t.Errorf("a row whose subject is another row's was read")
	}
	if _, _, err := retainedOf("sys.x", map[string]rows.Cell{retainedFieldSubject: {Value: []byte("sys.x")}}); err == nil {
		t.Errorf("a row of a subject outside evt. was read")
	}
}
