package brokeradmin_test

import (
	"os"
	"testing"

	"github.com/meshbox/meshbox/testing/meshtest"
)

func TestMain(m *testing.M) { os.Exit(meshtest.MainLeakFree(m)) }
