package meshtest

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// CountingProxy is a TCP proxy that counts the bytes it carries: Up from
// its clients to the upstream service, Down back to them, on every
// connection it carried, open or closed. A node whose broker URL names the
// proxy (Rewrite) sends all its broker traffic through it, so the counters
// are what the node costs its link to the broker: the payload of its TCP
// connections (no TCP/IP headers). It also reads the AMQP 0-9-1 frames it
// carries (Frames), so a figure can be taken apart by method and routing
// key. It forwards bytes as they come, without delay or shaping; use
// Proxy for faults.
type CountingProxy struct {
	ln       net.Listener
	upstream string
	up, down atomic.Int64
	accepted atomic.Int64
	tally    frameTally

	mu     sync.Mutex
	open   map[net.Conn]struct{} // both ends of every connection carried now
	closed bool
	wg     sync.WaitGroup // the accept loop and the copiers
}

// NewCountingProxy starts a counting proxy on a free loopback port that
// forwards to upstream (host:port). It is closed in cleanup.
func NewCountingProxy(tb testing.TB, upstream string) *CountingProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("counting proxy to %s: %v", upstream, err)
	}
	p := &CountingProxy{ln: ln, upstream: upstream, open: map[net.Conn]struct{}{}}
	p.tally.init()
	p.wg.Add(1)
	go p.accept() // exits when Close closes the listener
	tb.Cleanup(p.Close)
	return p
}

// Addr is the proxy's listen address (host:port).
func (p *CountingProxy) Addr() string { return p.ln.Addr().String() }

// Rewrite returns rawURL with its host:port upstream replaced by the
// proxy's.
func (p *CountingProxy) Rewrite(rawURL, upstream string) string {
	return strings.Replace(rawURL, upstream, p.Addr(), 1)
}

// Up is the bytes carried from the clients to the upstream so far.
func (p *CountingProxy) Up() int64 { return p.up.Load() }

// Down is the bytes carried from the upstream to the clients so far.
func (p *CountingProxy) Down() int64 { return p.down.Load() }

// Connections is the number of client connections accepted so far.
func (p *CountingProxy) Connections() int64 { return p.accepted.Load() }

// Frames returns what the proxy carried so far, by AMQP frame kind (see
// FrameKind): a copy the caller may keep.
func (p *CountingProxy) Frames() FrameStats { return p.tally.snapshot() }

// Close stops accepting, closes every connection it carries and returns
// once its goroutines are gone. It is idempotent.
func (p *CountingProxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	_ = p.ln.Close()
	for c := range p.open {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// accept takes client connections until the listener is closed.
func (p *CountingProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, u) {
			return
		}
		p.accepted.Add(1)
		p.wg.Add(2)
		go p.pipe(u, c, &p.up, p.tally.reader("up"))     // exits when either end closes
		go p.pipe(c, u, &p.down, p.tally.reader("down")) // exits when either end closes
	}
}

// track records both ends of a connection; false when the proxy closed
// meanwhile (it closes them).
func (p *CountingProxy) track(c, u net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		_ = u.Close()
		return false
	}
	p.open[c], p.open[u] = struct{}{}, struct{}{}
	return true
}

// pipe copies src to dst, counting into n and reading the frames with fr,
// until either end closes; then it closes both, so the other direction's
// pipe ends too.
func (p *CountingProxy) pipe(dst, src net.Conn, n *atomic.Int64, fr *frameReader) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			n.Add(int64(k))
			fr.feed(buf[:k])
			if _, werr := dst.Write(buf[:k]); werr != nil {
				break
			}
		}
		if err != nil {
			break // EOF, a reset or a close: the connection is over either way
		}
	}
	p.mu.Lock()
	delete(p.open, src)
	delete(p.open, dst)
	p.mu.Unlock()
	_ = src.Close()
	_ = dst.Close()
}
