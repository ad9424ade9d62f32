//go:build soak

package soak

import (
	"testing"

	"github.com/meshbox/meshbox/testing/cluster"
)

// TestSoakClusterFaults runs the broker-cluster fault scenario with the
// full 10,000 commands and 10,000 events (make test runs it with 3,000 of
// each): three meshbox nodes on a three-node RabbitMQ cluster, SIGKILL of
// the stage queue's leader, its restart, a graceful stop of another.
func TestSoakClusterFaults(t *testing.T) {
	cluster.Faults(t, cluster.Size{Each: 10000, Rate: 250})
}
