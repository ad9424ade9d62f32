package modules

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine of a supervisor (runners, the spawner, each process's
// waiter and readers) is gone once Close returned.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
