package link

import (
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// This file counts the link's sessions (its generations) and keeps the
// connections opened beside the link's two on its broker and credential,
// which are dialled again when the generation moves on.

// generation counts the link's sessions; Link.mu guards it.
type generation struct {
	n     uint64
	moved chan struct{} // closed when n moves on
}

// Generation returns the link's generation and a channel closed when it
// moves on.
func (l *Link) Generation() (uint64, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gen.moved == nil {
		l.gen.moved = make(chan struct{})
	}
	return l.gen.n, l.gen.moved
}

// MoveOn moves the generation on: the extra connections of the last one
// are to be dialled again.
func (l *Link) MoveOn() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen.n++
	if l.gen.moved != nil {
		close(l.gen.moved)
	}
	l.gen.moved = make(chan struct{})
}

// ExtraConnection is a connection of the node beside the link's two,
// opened on the link's broker and credential and not closed yet.
type ExtraConnection struct {
	Role   string    `json:"role"`   // what uses it: rows, the tables of rows
	Broker string    `json:"broker"` // host:port of the broker it is on
	User   string    `json:"user"`   // the broker user it logged in as
	Since  time.Time `json:"since"`
}

// extraConns are the connections AddExtra recorded; closed ones are
// dropped when the list is next read or added to. mu guards open.
type extraConns struct {
	mu   sync.Mutex
	open []extraConn
}

type extraConn struct {
	conn *amqp.Connection
	st   ExtraConnection
}

// AddExtra records c, a connection beside the link's two, until it
// closes.
func (l *Link) AddExtra(c *amqp.Connection, st ExtraConnection) {
	x := &l.extras
	x.mu.Lock()
	defer x.mu.Unlock()
	x.pruneLocked()
	x.open = append(x.open, extraConn{conn: c, st: st})
}

// Extras returns the extra connections still open, oldest first.
func (l *Link) Extras() []ExtraConnection {
	x := &l.extras
	x.mu.Lock()
	defer x.mu.Unlock()
	x.pruneLocked()
	var out []ExtraConnection
	for _, e := range x.open {
		out = append(out, e.st)
	}
	return out
}

func (x *extraConns) pruneLocked() {
	x.open = slices.DeleteFunc(x.open, func(e extraConn) bool { return e.conn.IsClosed() })
}
