package brokeradmin_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/meshbox/meshbox/testing/meshtest"
)

func TestMain(m *testing.M) {
	code := meshtest.Main(m)
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreCurrent()); err != nil {
			fmt.Fprintf(os.Stderr, "leaked goroutines: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
