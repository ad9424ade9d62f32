package suggest

import "testing"

func TestDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"status", "status", 0},
		{"status", "stauts", 1}, // a swap is one edit
		{"MESHBOX_NAT", "MESHBOX_NATS", 1},
		{"nats", "", 4},
		{"kitten", "sitting", 3},
	} {
		if got := Distance(tc.a, tc.b); got != tc.want {
			t.Errorf("Distance(%q, %q): got %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestNearest(t *testing.T) {
	known := []string{"status", "nodes", "caps", "call", "MESHBOX_NATS", "MESHBOX_NATS_MQTT", "MESHBOX_NODE"}
	for _, tc := range []struct {
		name, want string
		ok         bool
	}{
		{"stauts", "status", true},
		{"MESHBOX_NAT", "MESHBOX_NATS", true},
		{"MESHBOX_NATS_MQT", "MESHBOX_NATS_MQTT", true},
		{"cal", "call", true},
		{"status", "", false}, // itself is not a suggestion
		{"frobnicate", "", false},
		{"xy", "", false},
	} {
		got, ok := Nearest(tc.name, known)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Nearest(%q): got %q, %v, want %q, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}
