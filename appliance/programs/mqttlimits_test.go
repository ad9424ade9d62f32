package programs

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestMQTTLimitsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Program
		ok   bool
	}{
		{"none", Program{Name: "a", MQTT: true}, true},
		{"some", Program{Name: "a", MQTT: true, MQTTLimits: &MQTTLimits{RetainedBytes: 1 << 20, Sessions: 2}}, true},
		{"without mqtt", Program{Name: "a", MQTTLimits: &MQTTLimits{Sessions: 2}}, false},
		{"negative", Program{Name: "a", MQTT: true, MQTTLimits: &MQTTLimits{Inflight: -1}}, false},
		{"past the bound", Program{Name: "a", MQTT: true, MQTTLimits: &MQTTLimits{RetainedBytes: maxMQTTRetainedBytes + 1}}, false},
	} {
		if err := tc.p.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: got %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	got := Program{MQTT: true, MQTTLimits: &MQTTLimits{Sessions: 2}}.Limits()
	want := DefaultMQTTLimits
	want.Sessions = 2
	if got != want {
		t.Errorf("limits: got %+v, want %+v", got, want)
	}
}

// TestMQTTLimitsDoc: docs/mqtt.md states the defaults of DefaultMQTTLimits.
func TestMQTTLimitsDoc(t *testing.T) {
	data, err := os.ReadFile("../../docs/mqtt.md")
	if err != nil {
		t.Fatal(err)
	}
	d := DefaultMQTTLimits
	for flag, v := range map[string]string{
		"--mqtt-retained-msgs N": fmt.Sprint(d.RetainedMsgs),
		"--mqtt-retained SIZE":   fmt.Sprintf("%d MiB", d.RetainedBytes>>20),
		"--mqtt-inflight N":      fmt.Sprint(d.Inflight),
		"--mqtt-sessions N":      fmt.Sprint(d.Sessions),
	} {
		row := ""
		for _, l := range strings.Split(string(data), "\n") {
			if strings.Contains(l, "`"+flag) {
				row = l
			}
		}
		if !strings.Contains(row, "| "+v+" |") {
			t.Errorf("docs/mqtt.md: the row of %s is %q, want the default %s", flag, row, v)
		}
	}
}
