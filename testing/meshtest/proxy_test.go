package meshtest

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echoServer accepts connections and echoes lines until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // exits when the listener is closed in cleanup
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // exits when the peer closes
				defer c.Close()
				s := bufio.NewScanner(c)
				for s.Scan() {
					_, _ = c.Write(append(s.Bytes(), '\n'))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, d time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err := bufio.NewReader(c).ReadString('\n')
	return err
}

func TestProxyCutStallRestore(t *testing.T) {
	px := NewProxy(t, echoServer(t))
	dial := func() net.Conn {
		c, err := net.DialTimeout("tcp", px.Addr(), time.Second)
		if err != nil {
			t.Fatalf("dial proxy: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c := dial()
	if err := roundTrip(c, 2*time.Second); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}

	px.Cut(t)
	if err := roundTrip(c, time.Second); err == nil {
		t.Fatal("after Cut: round trip on an old connection succeeded, want failure")
	}
	if c2, err := net.DialTimeout("tcp", px.Addr(), time.Second); err == nil {
		c2.Close()
		t.Fatal("after Cut: new connection accepted, want refused")
	}

	px.Restore(t)
	c = dial()
	if err := roundTrip(c, 2*time.Second); err != nil {
		t.Fatalf("after Restore: %v", err)
	}

	px.Stall(t)
	if err := roundTrip(c, 500*time.Millisecond); err == nil {
		t.Fatal("while stalled: round trip succeeded, want a timeout")
	}
	px.Restore(t)
	c = dial()
	if err := roundTrip(c, 2*time.Second); err != nil {
		t.Fatalf("after un-stall: %v", err)
	}
}
