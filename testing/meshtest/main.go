package meshtest

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"

	"go.uber.org/goleak"
)

// defaultParallel is how many of a package's parallel tests (t.Parallel)
// Main lets run at once unless -test.parallel says otherwise. Integration
// tests mostly wait on brokers, databases, child processes and timers, so
// Go's default of one per core leaves a small machine idle.
const defaultParallel = 8

// Main runs the tests of an integration-test package and then stops the
// shared services and removes the harness's temporary files. Use it as
//
//	func TestMain(m *testing.M) { os.Exit(meshtest.Main(m)) }
//
// Unless the command line sets -test.parallel, up to defaultParallel
// parallel tests run at once (at least one per core).
//
// A package that checks for leaked goroutines calls goleak.Find after Main
// returns: the harness owns no goroutines then.
func Main(m *testing.M) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	setDefaultParallel()
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

// MainLeakFree is Main for a package whose tests leave no goroutine
// behind: once Main returned (the harness owns none then), any goroutine
// left fails the run, and the leaked ones are printed.
//
//	func TestMain(m *testing.M) { os.Exit(meshtest.MainLeakFree(m)) }
func MainLeakFree(m *testing.M, opts ...goleak.Option) int {
	code := Main(m)
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "leaked goroutines: %v\n", err)
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
	if err := stopLeased(); err != nil {
		errs = append(errs, err)
	}
	removeBinary()
	return errors.Join(errs...)
}

// setDefaultParallel sets -test.parallel to defaultParallel (or the
// number of cores, if more) unless the command line set it.
func setDefaultParallel() {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(max(defaultParallel, runtime.GOMAXPROCS(0))))
	}
}
