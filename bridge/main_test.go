package bridge_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/meshbox/meshbox/testing/meshtest"
)

// The fault tests' proxy (toxiproxy, in process) can leave a link's
// pipe goroutine blocked on its own channel after the proxy closed (a
// full make test ended so once, every test passed): the proxy's, not
// the bridge's.
func TestMain(m *testing.M) {
	os.Exit(meshtest.MainLeakFree(m,
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"),
	))
}
