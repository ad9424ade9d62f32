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
// Services named in early (SharedRabbitMQ, SharedPostgres) start at once,
// side by side and beside the first tests, instead of one after the
// other when a test first asks for each.
//
// A package that checks for leaked goroutines calls goleak.Find after Main
// returns: the harness owns no goroutines then.
func Main(m *testing.M, early ...Service) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	setDefaultParallel()
	removeStaleDirs()
	if !testing.Short() {
		startEarly(early)
	}
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
	shared.tlsMu.Lock()
	if shared.tls != nil {
		if err := shared.tls.destroy(); err != nil {
			errs = append(errs, fmt.Errorf("stop shared RabbitMQ with TLS: %w", err))
		}
		shared.tls = nil
	}
	shared.tlsMu.Unlock()
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

// Service names a shared service for Main to start early.
type Service int

const (
	SharedRabbitMQ Service = iota + 1 // RabbitMQ's broker
	SharedPostgres                    // Postgres's server
)

// startEarly starts the services named, each on a goroutine of its own
// that holds the service's lock until it is up: a test asking for one
// meanwhile waits for it. A failure is the first caller's, as always.
func startEarly(early []Service) {
	for _, s := range early {
		switch s {
		case SharedRabbitMQ:
			shared.rabbitMu.Lock()
			go func() {
				defer shared.rabbitMu.Unlock()
				startSharedRabbit()
			}()
		case SharedPostgres:
			shared.pgMu.Lock()
			go func() {
				defer shared.pgMu.Unlock()
				startSharedPG()
			}()
		}
	}
}
