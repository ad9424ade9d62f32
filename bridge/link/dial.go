package link

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Bounds of a dial when DialOptions leave them 0.
const (
	DialTimeout      = 5 * time.Second  // TCP connect
	HandshakeTimeout = 10 * time.Second // TLS and AMQP handshake
)

// Errors of a connection's settings, returned (wrapped) before the broker
// is tried.
var (
	// ErrCAFile means the CA file cannot be read or holds no PEM
	// certificate.
	ErrCAFile = errors.New("broker CA file")
	// ErrClientCert means the client certificate and its key cannot be
	// loaded.
	ErrClientCert = errors.New("broker client certificate")
)

// DialOptions are the settings of one connection to a broker.
type DialOptions struct {
	// URL is one broker URL, amqp:// or amqps://.
	URL string
	// Name is the connection's name as the broker shows it (management
	// UI, rabbitmqctl list_connections).
	Name string
	// CAFile, CertFile and KeyFile are the node's bridge settings: a CA trusted beside
	// the system's roots, and a client certificate, with which a URL
	// without a password logs in (EXTERNAL).
	CAFile, CertFile, KeyFile string
	// Heartbeat is the AMQP heartbeat (0: amqp091-go's default).
	Heartbeat time.Duration
	// DialTimeout bounds the TCP connect (0: 5 s), HandshakeTimeout the
	// TLS and AMQP handshakes after it (0: 10 s).
	DialTimeout, HandshakeTimeout time.Duration
}

// Dial opens one AMQP connection as the node's broker link does: TLS
// that trusts the system's roots and opts.CAFile, the client certificate
// when there is one, a login with it (SASL EXTERNAL) when the URL is
// amqps:// and has no password. Cancelling ctx aborts the handshake.
//
// A CA file or client certificate that cannot be used gives an error
// wrapping ErrCAFile or ErrClientCert; the broker's refusal at login is
// an *amqp.Error (its code says why).
func Dial(ctx context.Context, opts DialOptions) (*amqp.Connection, error) {
	conn, _, err := DialRaw(ctx, opts, nil)
	return conn, err
}

// DialRaw is Dial with a hook on the TCP connect: wrap (nil: none)
// gets the address and the connect's result and returns the socket the
// connection uses, or an error. DialRaw returns the raw socket too.
func DialRaw(ctx context.Context, opts DialOptions, wrap func(addr string, c net.Conn, err error) (net.Conn, error)) (*amqp.Connection, net.Conn, error) {
	connectWithin, handshake := cmp.Or(opts.DialTimeout, DialTimeout), cmp.Or(opts.HandshakeTimeout, HandshakeTimeout)
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
	if ExternalLogin(opts.CertFile, opts.URL) {
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
	cert, err := LoadClientCert(opts.CertFile, opts.KeyFile)
	if err != nil {
		return nil, err
	}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	return tc, nil
}

// LoadClientCert loads a client certificate and its key; nil without one.
func LoadClientCert(certFile, keyFile string) (*tls.Certificate, error) {
	if certFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrClientCert, err)
	}
	return &cert, nil
}

// ExternalLogin reports whether a connection to raw logs in with the
// client certificate (EXTERNAL): a certificate is configured (certFile),
// the URL is amqps:// and carries no password.
func ExternalLogin(certFile, raw string) bool {
	if certFile == "" {
		return false
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "amqps" {
		return false
	}
	_, has := u.User.Password()
	return !has
}

// DialCorked opens a connection with opts whose socket is a *CorkConn,
// returned as cork: publishers batch their messages through it, an acker
// its acks. dialed (nil: none) is told the TCP connect's outcome; a
// connect that failed because the broker does not answer gives an
// *UnreachableError. Cancelling ctx aborts the handshake. abort closes
// the socket at once: an AMQP call waiting on a broker that stalls fails
// with it.
func DialCorked(ctx context.Context, opts DialOptions, dialed func(error)) (conn *amqp.Connection, cork *CorkConn, abort func(), err error) {
	conn, raw, err := DialRaw(ctx, opts, func(addr string, c net.Conn, err error) (net.Conn, error) {
		if dialed != nil {
			dialed(err)
		}
		if err != nil {
			if Unreachable(err) {
				return nil, &UnreachableError{Addr: addr, Err: err}
			}
			return nil, err
		}
		cork = &CorkConn{Conn: c}
		return cork, nil
	})
	if err != nil {
		return nil, nil, nil, err
	}
	return conn, cork, func() { _ = raw.Close() }, nil
}
