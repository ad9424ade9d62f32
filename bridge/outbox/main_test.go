package outbox

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run when a test leaves a writer goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
