package appliance

import (
	"reflect"
	"testing"
)

// TestApplianceKeepsTheWiring: the appliance's running parts are one value
// published once (running), not fields of the appliance each; what is
// left is the wiring, and stays small.
func TestApplianceKeepsTheWiring(t *testing.T) {
	const most = 15
	if n := reflect.TypeFor[Appliance]().NumField(); n > most {
		t.Errorf("Appliance has %d fields, want at most %d: a running part belongs in running (running.go)", n, most)
	}
}
