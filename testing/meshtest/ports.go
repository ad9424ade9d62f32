package meshtest

import (
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
)

var (
	portsMu sync.Mutex
	// portsGiven holds every port FreePort returned in this process, so that
	// two callers never get the same one even if neither has bound it yet.
	portsGiven = map[int]bool{}
)

// FreePort returns a loopback TCP port that was free a moment ago and has not
// been returned before in this process.
func FreePort(tb testing.TB) int {
	tb.Helper()
	p, err := freePort()
	if err != nil {
		tb.Fatalf("meshtest: free port: %v", err)
	}
	return p
}

func freePort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !portsGiven[p] {
			portsGiven[p] = true
			return p, nil
		}
	}
}

// ClosedAddr returns host:port on the loopback network that nothing
// listens on for the rest of tb: ClosedPort's port on 127.0.0.77, an
// address of the loopback network no service of the tests binds, so that
// not even a listener on 127.0.0.1 that shares the port (one once
// answered a test's "nothing listening" with HTTP 401) can answer there.
func ClosedAddr(tb testing.TB) string {
	tb.Helper()
	return "127.0.0.77:" + strconv.Itoa(ClosedPort(tb))
}

// ClosedPort returns a loopback TCP port that nothing listens on for the
// rest of tb: a socket of this process holds it bound without listening,
// so a connection to it is refused and no other process (another test
// package's broker, say) can take it in the meantime, as it could a port
// that was only free a moment ago.
func ClosedPort(tb testing.TB) int {
	tb.Helper()
	// Bound on the dual-stack wildcard where the machine has IPv6: that
	// holds the port for 127.0.0.1 and for any wildcard listener too (a
	// broker of another test package listening on [::] would otherwise
	// take it and answer there).
	if fd, err := syscall.Socket(syscall.AF_INET6, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0); err == nil {
		if syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 0) == nil &&
			syscall.Bind(fd, &syscall.SockaddrInet6{}) == nil {
			if sa, err := syscall.Getsockname(fd); err == nil {
				tb.Cleanup(func() { _ = syscall.Close(fd) })
				return sa.(*syscall.SockaddrInet6).Port
			}
		}
		_ = syscall.Close(fd)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatalf("meshtest: closed port: socket: %v", err)
	}
	tb.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatalf("meshtest: closed port: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatalf("meshtest: closed port: %v", err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}
