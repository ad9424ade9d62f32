package bridge

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshbox/meshbox/internal/brokerurl"
	amqp "github.com/rabbitmq/amqp091-go"
)

// This file is the one way in to the broker: every AMQP connection of the
// node is dialled here. The link's own two per session (dial), the
// connections other parts of the node open beside them on the link's
// broker and credential (DialExtra: the tables of rows), and the doctor's
// check (DialBroker) share the TLS settings, the CA file, the client
// certificate (SASL EXTERNAL), the timeouts and the connection names.

// DialOptions are the settings of one connection to a broker.
type DialOptions struct {
	// URL is one broker URL, amqp:// or amqps://.
	URL string
	// Name is the connection's name as the broker shows it (management
	// UI, rabbitmqctl list_connections).
	Name string
	// CAFile, CertFile and KeyFile are as in Config: a CA trusted beside
	// the system's roots, and a client certificate, with which a URL
	// without a password logs in (EXTERNAL).
	CAFile, CertFile, KeyFile string
	// Heartbeat is the AMQP heartbeat (0: amqp091-go's default).
	Heartbeat time.Duration
	// DialTimeout bounds the TCP connect (0: 5 s), HandshakeTimeout the
	// TLS and AMQP handshakes after it (0: 10 s).
	DialTimeout, HandshakeTimeout time.Duration
}

// DialBroker opens one AMQP connection as the node's broker link does: TLS
// that trusts the system's roots and opts.CAFile, the client certificate
// when there is one, a login with it (SASL EXTERNAL) when the URL is
// amqps:// and has no password. Cancelling ctx aborts the handshake.
//
// A CA file or client certificate that cannot be used gives an error
// wrapping ErrCAFile or ErrClientCert; the broker's refusal at login is
// an *amqp.Error (its code says why).
func DialBroker(ctx context.Context, opts DialOptions) (*amqp.Connection, error) {
	conn, _, err := dialBroker(ctx, opts, nil)
	return conn, err
}

// dialBroker is DialBroker with a hook on the TCP connect: wrap (nil: none)
// gets the address and the connect's result and returns the socket the
// connection uses, or an error. dialBroker returns the raw socket too.
func dialBroker(ctx context.Context, opts DialOptions, wrap func(addr string, c net.Conn, err error) (net.Conn, error)) (*amqp.Connection, net.Conn, error) {
	connectWithin, handshake := cmp.Or(opts.DialTimeout, dialTimeout), cmp.Or(opts.HandshakeTimeout, handshakeLimit)
	cfg := amqp.Config{
		Heartbeat:  opts.Heartbeat,
		Locale:     "en_US",
		Properties: amqp.NewConnectionProperties(),
	}
	if opts.Name != "" {
		cfg.Properties.SetClientConnectionName(opts.Name)
	}
	if strings.HasPrefix(opts.URL, "amqps://") {
		tc, err := opts.tlsConfig()
		if err != nil {
			return nil, nil, err
		}
		cfg.TLSClientConfig = tc
	}
	if externalLogin(opts.CertFile, opts.URL) {
		cfg.SASL = []amqp.Authentication{&amqp.ExternalAuth{}}
	}
	var (
		stop func() bool
		raw  net.Conn
	)
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: connectWithin}
		c, err := d.DialContext(ctx, network, addr)
		var use net.Conn = c
		if wrap != nil {
			use, err = wrap(addr, c, err)
		}
		if err != nil {
			if c != nil {
				c.Close()
			}
			return nil, err
		}
		if err := c.SetDeadline(time.Now().Add(handshake)); err != nil { // cleared by amqp091 once open
			c.Close()
			return nil, err
		}
		stop = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
		raw = c
		return use, nil
	}
	conn, err := amqp.DialConfig(opts.URL, cfg)
	if stop != nil {
		stop()
	}
	if err != nil {
		return nil, nil, err
	}
	return conn, raw, nil
}

// tlsConfig trusts the system roots plus opts.CAFile, and presents the
// client certificate when there is one.
func (opts DialOptions) tlsConfig() (*tls.Config, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if opts.CAFile != "" {
		pem, err := os.ReadFile(opts.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrCAFile, err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w %s: no PEM certificates", ErrCAFile, opts.CAFile)
		}
	}
	tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	cert, err := loadClientCert(opts.CertFile, opts.KeyFile)
	if err != nil {
		return nil, err
	}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	return tc, nil
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
func (b *Bridge) dial(ctx context.Context, url, role string) (conn *amqp.Connection, cork *corkConn, abort func(), err error) {
	conn, raw, err := dialBroker(ctx, b.dialOptions(url, role), func(addr string, c net.Conn, err error) (net.Conn, error) {
		b.m.dialed(err)
		if err != nil {
			if unreachable(err) {
				return nil, &unreachableError{addr: addr, err: err}
			}
			return nil, err
		}
		cork = &corkConn{Conn: c}
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
