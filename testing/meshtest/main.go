package meshtest

import (
	"errors"
	"fmt"
	"os"
	"testing"
)

// Main runs the tests of an integration-test package and then stops the
// shared services and removes the harness's temporary files. Use it as
//
//	func TestMain(m *testing.M) { os.Exit(meshtest.Main(m)) }
//
// A package that checks for leaked goroutines calls goleak.Find after Main
// returns: the harness owns no goroutines then.
func Main(m *testing.M) int {
	removeStaleDirs()
	code := m.Run()
	if err := stopShared(); err != nil {
		fmt.Fprintf(os.Stderr, "meshtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// stopShared stops the shared services and removes the built binary.
func stopShared() error {
	var errs []error
	shared.rabbitMu.Lock()
	if shared.rabbit != nil {
		if err := shared.rabbit.destroy(); err != nil {
			errs = append(errs, fmt.Errorf("stop shared RabbitMQ: %w", err))
		}
		shared.rabbit = nil
	}
	shared.rabbitMu.Unlock()
	shared.pgMu.Lock()
	if shared.pg != nil {
		if err := shared.pg.destroy(); err != nil {
			errs = append(errs, fmt.Errorf("stop shared PostgreSQL: %w", err))
		}
		shared.pg = nil
	}
	shared.pgMu.Unlock()
	removeBinary()
	return errors.Join(errs...)
}
