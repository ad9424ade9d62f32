package bridge

import (
	"context"
	"fmt"
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
// counted in the link's dials (link.DialCorked). Cancelling ctx aborts
// the handshake. abort closes the connection's socket at once: an AMQP
// call waiting on a broker that stalls fails with it. The publishers batch
// their messages through cork, the acker its acks.
func (b *Bridge) dial(ctx context.Context, url, role string) (conn *amqp.Connection, cork *brokerlink.CorkConn, abort func(), err error) {
	return brokerlink.DialCorked(ctx, b.dialOptions(url, role), b.m.Dialed)
}

// ExtraConnection is a connection of the node beside the link's two,
// opened by DialExtra and not closed yet.
type ExtraConnection = brokerlink.ExtraConnection

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
	b.link.AddExtra(conn, ExtraConnection{Role: role, Broker: brokerurl.Host(s.url), User: s.user, Since: time.Now()})
	return conn, s.user, nil
}

// LinkGeneration counts the link's sessions: gen moves on each time the
// link connects anew (a reconnect, a failover to another broker of its
// list, a new broker URL, a credential handover) and when the bridge
// closes; moved is closed when it moves on from gen.
func (b *Bridge) LinkGeneration() (gen uint64, moved <-chan struct{}) {
	return b.link.Generation()
}
