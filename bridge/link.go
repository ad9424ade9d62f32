package bridge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	dialTimeout    = 5 * time.Second  // TCP connect
	handshakeLimit = 10 * time.Second // TLS and AMQP handshake
	closeLimit     = time.Second      // graceful close of a connection being dropped
	publishWindow  = 1024             // unconfirmed publishes per session
	// stageDeliveryLimit is the quorum queues' x-delivery-limit: a backstop
	// above any retry budget, so the bridge's own budget (with a reason)
	// dead-letters first. It is a constant so that every node declares the
	// same arguments.
	stageDeliveryLimit = 1000
	// eventQueueExpiry deletes the event queue of a node unused this long.
	eventQueueExpiry = 7 * 24 * time.Hour
)

// runLink owns the broker link: it connects, runs a session until it ends,
// and reconnects with backoff and jitter. first is a session Start already
// opened (or nil). runLink exits when b.quit is closed.
func (b *Bridge) runLink(first *session) {
	sess := first
	failures := 0
	var refusedSince time.Time
	for {
		if sess == nil {
			url := b.currentURL()
			if url == "" {
				b.setState(StateNone, "no broker configured")
				select {
				case <-b.quit:
					return
				case <-b.urlChanged:
					continue
				}
			}
			if st, _ := b.linkState(); st == StateNone {
				b.setState(StateConnecting, "")
			}
			ctx, cancel := b.withQuit(context.Background())
			s, err := b.connect(ctx, url)
			cancel()
			if err != nil {
				select {
				case <-b.quit:
					return
				default:
				}
				failures++
				b.m.err(errKindLink)
				var inUse *NodeNameInUseError
				if errors.As(err, &inUse) {
					if refusedSince.IsZero() {
						refusedSince = time.Now()
						b.log.Error("broker refuses this node's name", "node", b.cfg.Node, "reason", inUse.Detail)
					}
					// A stale connection of ours lasts at most two heartbeats; longer means
					// another process owns the name.
					if time.Since(refusedSince) > 3*b.cfg.Heartbeat+5*time.Second {
						select {
						case b.fatal <- err:
						default:
						}
					}
				} else {
					refusedSince = time.Time{}
				}
				b.setState(StateOffline, err.Error())
				select {
				case <-b.quit:
					return
				case <-b.urlChanged:
					failures = 0
					b.setState(StateConnecting, "broker URL changed")
				case <-time.After(b.backoff(failures)):
				}
				continue
			}
			sess = s
			if b.m != nil && b.everConnected() {
				b.m.reconnects.Inc()
			}
		}
		failures, refusedSince = 0, time.Time{}
		b.sess.Store(sess)
		sess.start()
		b.setState(StateConnected, "")
		reason := sess.run()
		sess.end()
		b.sess.CompareAndSwap(sess, nil)
		select {
		case <-b.quit:
			b.setState(StateOffline, reason)
			sess.stop()
			return
		default:
		}
		if reason == reasonURLChanged {
			b.setState(StateConnecting, reason)
		} else {
			b.m.err(errKindLink)
			b.setState(StateOffline, reason)
		}
		sess.stop()
		sess = nil
		if reason != reasonURLChanged {
			// A link that just dropped is retried soon, but not in a tight loop.
			select {
			case <-b.quit:
				return
			case <-time.After(b.backoff(1)):
			case <-b.urlChanged:
			}
		}
	}
}

const (
	reasonURLChanged = "broker URL changed"
	reasonShutdown   = "node shutting down"
)

// everConnected reports whether a connected state was ever recorded
// before the current one.
func (b *Bridge) everConnected() bool {
	b.linkMu.Lock()
	defer b.linkMu.Unlock()
	for _, h := range b.history {
		if h.State == StateConnected {
			return true
		}
	}
	return false
}

// backoff returns the wait before attempt n (1-based): exponential from
// ReconnectMin up to ReconnectMax, with the upper half randomized.
func (b *Bridge) backoff(n int) time.Duration {
	d := b.cfg.ReconnectMin
	for i := 1; i < n && d < b.cfg.ReconnectMax; i++ {
		d *= 2
	}
	d = min(d, b.cfg.ReconnectMax)
	return d/2 + rand.N(d/2+1)
}

// withQuit returns a context that is cancelled by cancel or when the bridge
// closes. A helper goroutine lives until one of the two.
func (b *Bridge) withQuit(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() { // exits on cancel or on quit
		select {
		case <-b.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// dial opens the AMQP connection. Cancelling ctx aborts the handshake.
func (b *Bridge) dial(ctx context.Context, url string) (*amqp.Connection, error) {
	cfg := amqp.Config{
		Heartbeat:  b.cfg.Heartbeat,
		Locale:     "en_US",
		Properties: amqp.NewConnectionProperties(),
	}
	cfg.Properties.SetClientConnectionName("meshbox node " + b.cfg.Node)
	if strings.HasPrefix(url, "amqps://") {
		tc, err := b.tlsConfig()
		if err != nil {
			return nil, err
		}
		cfg.TLSClientConfig = tc
	}
	var stop func() bool
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: dialTimeout}
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if err := conn.SetDeadline(time.Now().Add(handshakeLimit)); err != nil { // cleared by amqp091 once open
			conn.Close()
			return nil, err
		}
		stop = context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
		return conn, nil
	}
	conn, err := amqp.DialConfig(url, cfg)
	if stop != nil {
		stop()
	}
	if err != nil {
		return nil, err
	}
	return conn, nil
}

// tlsConfig trusts the system roots plus Config.CAFile.
func (b *Bridge) tlsConfig() (*tls.Config, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if b.cfg.CAFile != "" {
		pem, err := os.ReadFile(b.cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("broker CA file: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("broker CA file %s: no PEM certificates", b.cfg.CAFile)
		}
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
