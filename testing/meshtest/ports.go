package meshtest

import (
	"net"
	"sync"
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
