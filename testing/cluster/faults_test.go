package cluster

import "testing"

// TestClusterFaultsLoseNothing runs the fault scenario (Faults) with 3,000
// commands and 3,000 events at 100 per second each, sized for make test;
// make soak runs it with 10,000 of each.
func TestClusterFaultsLoseNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	Faults(t, Size{Each: 3000, Rate: 100})
}
