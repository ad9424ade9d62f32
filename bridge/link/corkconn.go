package link

import (
	"net"
	"sync"
)

// CorkMax bounds the bytes a corked connection holds back.
const CorkMax = 64 << 10

// CorkConn is the publishing connection's socket. amqp091 writes every
// message with a system call of its own; while a publisher hands a run of
// messages to the library, the connection is corked and the writes wait in
// a buffer, written with one system call when the run ends (or the buffer
// fills, or a publisher must wait for the broker). Corks nest: the buffer
// is written when the last one is removed. Order is kept: every write goes
// through the buffer while anything waits in it.
type CorkConn struct {
	net.Conn

	mu    sync.Mutex // held across writes to the socket: they stay in order
	corks int
	buf   []byte
	err   error // a write failed: every later one fails with it
}

func (c *CorkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if c.corks > 0 && len(c.buf)+len(p) <= CorkMax {
		c.buf = append(c.buf, p...)
		return len(p), nil
	}
	if err := c.flushLocked(); err != nil {
		return 0, err
	}
	n, err := c.Conn.Write(p)
	if err != nil {
		c.err = err
	}
	return n, err
}

// cork holds back writes until the matching uncork.
func (c *CorkConn) Cork() {
	c.mu.Lock()
	c.corks++
	c.mu.Unlock()
}

// uncork removes a cork; the last one writes what was held back.
func (c *CorkConn) Uncork() {
	c.mu.Lock()
	c.corks--
	var err error
	if c.corks == 0 {
		err = c.flushLocked()
	}
	c.mu.Unlock()
	c.failed(err)
}

// flush writes what was held back now, corked or not: before waiting for
// the broker's confirms, which it can only send for what it received.
func (c *CorkConn) Flush() {
	c.mu.Lock()
	err := c.flushLocked()
	c.mu.Unlock()
	c.failed(err)
}

// failed closes the socket after a failed write the library did not see
// (it was told the bytes were written): its reader then fails and the
// session ends.
func (c *CorkConn) failed(err error) {
	if err != nil {
		_ = c.Conn.Close()
	}
}

func (c *CorkConn) flushLocked() error {
	if len(c.buf) == 0 || c.err != nil {
		c.buf = c.buf[:0]
		return c.err
	}
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	if err != nil {
		c.err = err
	}
	return err
}
