package link

import (
	"errors"
	"net"
	"testing"
)

// writesConn records each write to it as one system call would be.
type writesConn struct {
	net.Conn
	writes []string
	fail   error
	closed bool
}

func (c *writesConn) Write(p []byte) (int, error) {
	if c.fail != nil {
		return 0, c.fail
	}
	c.writes = append(c.writes, string(p))
	return len(p), nil
}

func (c *writesConn) Close() error { c.closed = true; return nil }

func TestCorkConnBatchesWritesInOrder(t *testing.T) {
	w := &writesConn{}
	c := &CorkConn{Conn: w}
	_, _ = c.Write([]byte("a"))
	c.Cork()
	_, _ = c.Write([]byte("b"))
	c.Cork() // nested: the inner uncork writes nothing
	_, _ = c.Write([]byte("c"))
	c.Uncork()
	if len(w.writes) != 1 {
		t.Fatalf("writes while corked: got %q, want only the one before the cork", w.writes)
	}
	c.Flush() // before waiting for the broker: written now, still corked
	_, _ = c.Write([]byte("d"))
	c.Uncork()
	_, _ = c.Write([]byte("e"))
	want := []string{"a", "bc", "d", "e"}
	if len(w.writes) != len(want) {
		t.Fatalf("got writes %q, want %q", w.writes, want)
	}
	for i := range want {
		if w.writes[i] != want[i] {
			t.Fatalf("got writes %q, want %q", w.writes, want)
		}
	}
}

// A write that fails after the library was told it succeeded closes the
// socket, so that the library's reader fails and the session ends.
func TestCorkConnFailedFlushClosesTheSocket(t *testing.T) {
	w := &writesConn{}
	c := &CorkConn{Conn: w}
	c.Cork()
	if n, err := c.Write([]byte("held")); n != 4 || err != nil {
		t.Fatalf("corked write: got %d, %v", n, err)
	}
	w.fail = errors.New("broken pipe")
	c.Uncork()
	if !w.closed {
		t.Fatal("the socket stayed open after a held-back write failed")
	}
	if _, err := c.Write([]byte("more")); err == nil {
		t.Fatal("a write after a failed one succeeded")
	}
}
