package node

import "github.com/meshbox/meshbox/bridge"

// The bridge is the Link the appliance wires.
var _ Link = (*bridge.Bridge)(nil)
