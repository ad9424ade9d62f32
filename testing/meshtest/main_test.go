package meshtest_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/meshbox/meshbox/testing/meshtest"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("MESHTEST_FAKE_NODE"); mode != "" {
		os.Exit(fakeNode(mode, os.Args[1:]))
	}
	code := meshtest.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
