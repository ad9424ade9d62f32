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

// TestProxyDelayAndBandwidth: a delayed proxy adds twice its delay to a
// round trip, a bandwidth limit paces a transfer, and both outlast a
// Stall and its Restore.
func TestProxyDelayAndBandwidth(t *testing.T) {
	px := NewProxy(t, echoServer(t))
	c, err := net.DialTimeout("tcp", px.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	timed := func() time.Duration {
		t.Helper()
		start := time.Now()
		if err := roundTrip(c, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	if d := timed(); d > 40*time.Millisecond {
		t.Fatalf("undelayed round trip took %v", d)
	}
	px.Delay(t, 40*time.Millisecond)
	px.Stall(t)
	px.Restore(t)
	c.Close()
	if c, err = net.DialTimeout("tcp", px.Addr(), time.Second); err != nil {
		t.Fatal(err)
	}
	if d := timed(); d < 80*time.Millisecond || d > 400*time.Millisecond {
		t.Fatalf("round trip with 40ms each way took %v, want about 80ms", d)
	}
	px.Delay(t, 0)
	if d := timed(); d > 40*time.Millisecond {
		t.Fatalf("round trip after removing the delay took %v", d)
	}

	px.Bandwidth(t, 800_000) // 100 kB/s each way
	line := make([]byte, 50_000)
	for i := range line {
		line[i] = 'x'
	}
	line[len(line)-1] = '\n'
	start := time.Now()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(line); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReaderSize(c, len(line)).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	// 50 kB up and 50 kB down at 100 kB/s: about 0.5s each way, partly overlapped.
	if d := time.Since(start); d < 400*time.Millisecond || d > 3*time.Second {
		t.Fatalf("50 kB each way at 100 kB/s took %v", d)
	}
}

func TestByteTapCounts(t *testing.T) {
	bt := NewByteTap(t, echoServer(t))
	c, err := net.DialTimeout("tcp", bt.Addr(), time.Second)
	if err != nil {
		t.Fatalf("dial tap: %v", err)
	}
	defer c.Close()
	for range 3 {
		if err := roundTrip(c, 2*time.Second); err != nil {
			t.Fatalf("through the tap: %v", err)
		}
	}
	// The echo reaches the client as the tap writes it; the tap counts
	// it once the write returned, a moment later on a loaded machine.
	deadline := time.Now().Add(2 * time.Second)
	for (bt.Up() != 15 || bt.Down() != 15) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if up, down := bt.Up(), bt.Down(); up != 15 || down != 15 {
		t.Errorf("counts: got up %d, down %d, want 15 each (three ping lines each way)", up, down)
	}
	bt.Reset()
	if up, down := bt.Up(), bt.Down(); up != 0 || down != 0 {
		t.Errorf("after Reset: got up %d, down %d, want 0", up, down)
	}
}
