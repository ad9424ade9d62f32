package bridge

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	brokerlink "github.com/meshbox/meshbox/bridge/link"
	"github.com/meshbox/meshbox/internal/brokerurl"
	amqp "github.com/rabbitmq/amqp091-go"
)

// This file is the one way in to the broker: every AMQP connection of the
// node is dialled here. The link's own two per session (dial), the
// connections other parts of the node open beside them on the link's
// broker and credential (DialExtra: the tables of rows), and the doctor's
// check (DialBroker) share the TLS settings, the CA file, the client
// certificate (SASL EXTERNAL), the timeouts and the connection names.

// DialOptions are the settings of one connection to a broker (the link
// package's).
type DialOptions = brokerlink.DialOptions

// DialBroker opens one AMQP connection as the node's broker link does
// (link.Dial).
func DialBroker(ctx context.Context, opts DialOptions) (*amqp.Connection, error) {
	return brokerlink.Dial(ctx, opts)
}

// dialOptions are the options of the node's connections to url for role.
func (b *Bridge) dialOptions(url, role string) DialOptions {
	return DialOptions{URL: url, Name: "meshbox node " + b.cfg.Node + " (" + role + ")",
		CAFile: b.cfg.CAFile, CertFile: b.cfg.CertFile, KeyFile: b.cfg.KeyFile, Heartbeat: b.cfg.Heartbeat}
}

// dial opens an AMQP connection named "meshbox node <node> (<role>)",
// counted in the link's dials. Cancelling ctx aborts the handshake. abort
// closes the connection's socket at once: an AMQP call waiting on a
// broker that stalls fails with it. The connection's socket is a
// *corkConn, returned as cork: the publishers batch their messages
// through it, the acker its acks.
func (b *Bridge) dial(ctx context.Context, url, role string) (conn *amqp.Connection, cork *brokerlink.CorkConn, abort func(), err error) {
	conn, raw, err := brokerlink.DialRaw(ctx, b.dialOptions(url, role), func(addr string, c net.Conn, err error) (net.Conn, error) {
		b.m.dialed(err)
		if err != nil {
			if unreachable(err) {
				return nil, &unreachableError{addr: addr, err: err}
			}
			return nil, err
		}
		cork = &brokerlink.CorkConn{Conn: c}
		return cork, nil
	})
	if err != nil {
		return nil, nil, nil, err
	}
	return conn, cork, func() { _ = raw.Close() }, nil
}

// ExtraConnection is a connection of the node beside the link's two,
// opened by DialExtra and not closed yet.
type ExtraConnection struct {
	Role   string    `json:"role"`   // what uses it: rows, the tables of rows
	Broker string    `json:"broker"` // host:port of the broker it is on
	User   string    `json:"user"`   // the broker user it logged in as
	Since  time.Time `json:"since"`
}

// DialExtra opens a connection for role beside the link's own, named
// "meshbox node <node> (<role>)", to the broker the link is on now, with
// the link's credential, TLS settings and timeouts; it counts in the
// link's dials and shows in BrokerStatus.Extra while it is open. user is
// the broker user it logged in as: the URL's, or the client
// certificate's. The connection is the caller's, who closes it.
//
// It stays on the broker and credential of the link's generation it was
// made in: read LinkGeneration before DialExtra, and once its moved
// channel is closed, close the connection and dial again.
//
// While the link is not connected DialExtra returns ErrLinkDown, after
// Close ErrClosed, and a broker that refuses the credential gives a
// *CredentialRefusedError.
func (b *Bridge) DialExtra(ctx context.Context, role string) (conn *amqp.Connection, user string, err error) {
	select {
	case <-b.quit:
		return nil, "", ErrClosed
	default:
	}
	s := b.liveSession(connectLimit) // during a credential handover: the new session
	if s == nil {
		return nil, "", ErrLinkDown
	}
	ctx, cancel := b.withQuit(ctx)
	defer cancel()
	conn, _, _, err = b.dial(ctx, s.url, role)
	if err != nil {
		return nil, "", fmt.Errorf("connect to broker (%s): %w", role, b.refused(err, s.user))
	}
	b.link.extras.add(conn, ExtraConnection{Role: role, Broker: brokerurl.Host(s.url), User: s.user, Since: time.Now()})
	return conn, s.user, nil
}

// LinkGeneration counts the link's sessions: gen moves on each time the
// link connects anew (a reconnect, a failover to another broker of its
// list, a new broker URL, a credential handover) and when the bridge
// closes; moved is closed when it moves on from gen.
func (b *Bridge) LinkGeneration() (gen uint64, moved <-chan struct{}) {
	return b.link.generation()
}

// linkGen counts the link's sessions (LinkGeneration); link.mu guards it.
type linkGen struct {
	n     uint64
	moved chan struct{} // closed when n moves on
}

// generation returns the link's generation and its moved channel.
func (l *link) generation() (uint64, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gen.moved == nil {
		l.gen.moved = make(chan struct{})
	}
	return l.gen.n, l.gen.moved
}

// use makes s the session in use (nil: none) and, for a session,
// moves the generation on.
func (l *link) use(s *session) {
	l.sess.Store(s)
	if s != nil {
		l.moveOn()
	}
}

// moveOn moves the generation on: the extra connections of the last one
// are to be dialled again.
func (l *link) moveOn() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen.n++
	if l.gen.moved != nil {
		close(l.gen.moved)
	}
	l.gen.moved = make(chan struct{})
}

// extraConns are the connections DialExtra opened; closed ones are
// dropped when the list is next read or added to. mu guards open.
type extraConns struct {
	mu   sync.Mutex
	open []extraConn
}

type extraConn struct {
	conn *amqp.Connection
	st   ExtraConnection
}

func (x *extraConns) add(c *amqp.Connection, st ExtraConnection) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.pruneLocked()
	x.open = append(x.open, extraConn{conn: c, st: st})
}

// list returns the connections still open, oldest first.
func (x *extraConns) list() []ExtraConnection {
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
