package meshtest_test

import (
	"os"
	"testing"

	"github.com/meshbox/meshbox/testing/meshtest"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("MESHTEST_FAKE_NODE"); mode != "" {
		os.Exit(fakeNode(mode, os.Args[1:]))
	}
	os.Exit(meshtest.MainLeakFree(m))
}
