// Package natstest runs an embedded NATS server for tests: one place for
// the setup every test suite needs (a free loopback port, no logs, no
// signal handlers, stopped in the test's cleanup), for the connections
// tests open to it, and for reading a service's error reply
// (ServiceError).
//
// It imports only the NATS server and client, so the package-internal
// tests of any meshbox package can use it; meshtest, which imports the
// appliance, cannot be imported there without a cycle.
package natstest

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// readyTimeout bounds the wait for a started server to accept clients.
const readyTimeout = 10 * time.Second

// Options returns the options Start begins with: loopback, a free port,
// no logging and no signal handlers.
func Options() *server.Options {
	return &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true}
}

// Start runs an embedded NATS server with Options, changed by mods in
// order, and returns it once it accepts connections. tb's cleanup shuts
// it down and waits until it is gone.
func Start(tb testing.TB, mods ...func(*server.Options)) *server.Server {
	tb.Helper()
	opts := Options()
	for _, mod := range mods {
		mod(opts)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("nats server: %v", err)
	}
	srv.Start()
	tb.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	if !srv.ReadyForConnections(readyTimeout) {
		tb.Fatalf("nats server not ready within %v", readyTimeout)
	}
	return srv
}

// Dialer returns a function that connects to srv in process (no TCP),
// with the caller's options: the shape of bridge.Config.Dial.
func Dialer(srv *server.Server) func(opts ...nats.Option) (*nats.Conn, error) {
	return func(opts ...nats.Option) (*nats.Conn, error) {
		return nats.Connect("", append(opts, nats.InProcessServer(srv))...)
	}
}

// Connect opens an in-process connection to srv; tb's cleanup closes it.
func Connect(tb testing.TB, srv *server.Server, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	nc, err := Dialer(srv)(opts...)
	if err != nil {
		tb.Fatalf("connect to nats in process: %v", err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// ConnectTCP opens a connection to srv over loopback TCP, as a local
// program would; tb's cleanup closes it.
func ConnectTCP(tb testing.TB, srv *server.Server, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(srv.ClientURL(), opts...)
	if err != nil {
		tb.Fatalf("connect to nats at %s: %v", srv.ClientURL(), err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// ServiceError returns the code and text of a NATS service's error reply
// (its Nats-Service-Error-Code and Nats-Service-Error headers): 0 and ""
// for a success or no reply. A code that is not a number reads as 0.
func ServiceError(m *nats.Msg) (code int, text string) {
	if m == nil || m.Header.Get("Nats-Service-Error") == "" && m.Header.Get("Nats-Service-Error-Code") == "" {
		return 0, ""
	}
	code, _ = strconv.Atoi(m.Header.Get("Nats-Service-Error-Code"))
	return code, m.Header.Get("Nats-Service-Error")
}
