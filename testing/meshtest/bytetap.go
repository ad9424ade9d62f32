package meshtest

import (
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// ByteTap is a plain TCP relay that counts the bytes it carries each way:
// put it in front of a Proxy (node -> tap -> proxy -> service) to learn
// how many bytes a node wrote into a shaped link and how many came back.
// Counts include every connection through it since it started (or since
// the last Reset).
type ByteTap struct {
	ln       net.Listener
	upstream string
	up, down atomic.Int64 // client -> upstream, upstream -> client

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup // the accept loop and the relays
}

// NewByteTap starts a tap on a free loopback port that relays to upstream
// (host:port). It is stopped in cleanup, which closes its connections and
// waits for its goroutines.
func NewByteTap(tb testing.TB, upstream string) *ByteTap {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("byte tap to %s: %v", upstream, err)
	}
	bt := &ByteTap{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	bt.wg.Add(1)
	go bt.accept() // exits when the listener is closed in cleanup
	tb.Cleanup(bt.close)
	return bt
}

// Addr is the tap's listen address (host:port).
func (bt *ByteTap) Addr() string { return bt.ln.Addr().String() }

// Rewrite returns rawURL with its host:port replaced by the tap's.
func (bt *ByteTap) Rewrite(rawURL, upstream string) string {
	return strings.Replace(rawURL, upstream, bt.Addr(), 1)
}

// Up is the bytes clients wrote towards the upstream.
func (bt *ByteTap) Up() int64 { return bt.up.Load() }

// Down is the bytes the upstream sent back to clients.
func (bt *ByteTap) Down() int64 { return bt.down.Load() }

// Reset sets both counts to zero.
func (bt *ByteTap) Reset() {
	bt.up.Store(0)
	bt.down.Store(0)
}

func (bt *ByteTap) accept() {
	defer bt.wg.Done()
	for {
		c, err := bt.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", bt.upstream)
		if err != nil {
			c.Close()
			continue
		}
		if !bt.track(c, u) {
			c.Close()
			u.Close()
			return
		}
		bt.wg.Add(2)
		go bt.relay(u, c, &bt.up)   // exits when either side closes
		go bt.relay(c, u, &bt.down) // exits when either side closes
	}
}

// track records a relayed pair; false once the tap is closed.
func (bt *ByteTap) track(conns ...net.Conn) bool {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	if bt.closed {
		return false
	}
	for _, c := range conns {
		bt.conns[c] = struct{}{}
	}
	return true
}

// relay copies src to dst, counting into n, and closes both when src ends
// (the other relay of the pair then ends too).
func (bt *ByteTap) relay(dst, src net.Conn, n *atomic.Int64) {
	defer bt.wg.Done()
	_, _ = io.Copy(countingWriter{dst, n}, src)
	for _, c := range []net.Conn{dst, src} {
		bt.mu.Lock()
		delete(bt.conns, c)
		bt.mu.Unlock()
		c.Close()
	}
}

func (bt *ByteTap) close() {
	bt.mu.Lock()
	bt.closed = true
	for c := range bt.conns {
		c.Close()
	}
	bt.mu.Unlock()
	_ = bt.ln.Close()
	bt.wg.Wait()
}

// countingWriter adds what it writes to n.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (cw countingWriter) Write(p []byte) (int, error) {
	k, err := cw.w.Write(p)
	cw.n.Add(int64(k))
	return k, err
}
