package link

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Pair is a session's two connections to one broker: publishing and
// consuming are kept apart, so that a broker that blocks publishers under
// a resource alarm does not block the node's acks with them.
type Pair struct {
	Pub, Con         *amqp.Connection
	PubCork, ConCork *CorkConn // their sockets, for batched writes
	// Abort closes both sockets at once: an AMQP call waiting on a broker
	// that stalls fails with it.
	Abort func()
}

// DialPair dials the publishing connection (pub) and the consuming one
// (con) at once, each with DialCorked: a handshake is several round trips,
// which on a home link to the broker is what a reconnect waits for. When
// either fails, both are closed (waiting at most closeLimit for the
// broker) and the error returned; a connection the broker dropped during
// its login while it let the other log in with the same credential gives
// ErrLoginDropped.
func DialPair(ctx context.Context, pub, con DialOptions, dialed func(error), closeLimit time.Duration) (Pair, error) {
	type result struct {
		conn  *amqp.Connection
		cork  *CorkConn
		abort func()
		err   error
	}
	pubDial := make(chan result, 1)
	go func() { // exits when the dial ends (ctx bounds it)
		var d result
		d.conn, d.cork, d.abort, d.err = DialCorked(ctx, pub, dialed)
		pubDial <- d
	}()
	conConn, conCork, abortCon, err := DialCorked(ctx, con, dialed)
	pd := <-pubDial
	// One connection logged in and the other "refused": the broker
	// dropped the other during its login (the client library reports a
	// socket closed there as a refused login), it did not refuse the
	// credential the first one used.
	dropped := (err == nil) != (pd.err == nil)
	if err == nil {
		err = pd.err
	}
	if dropped && loginDropped(err) {
		err = fmt.Errorf("the broker closed a connection during its login, and let the other log in with the same credential: %w", ErrLoginDropped)
	}
	if err != nil {
		for _, c := range []struct {
			conn  *amqp.Connection
			abort func()
		}{{conConn, abortCon}, {pd.conn, pd.abort}} {
			if c.conn != nil {
				c.abort()
				_ = c.conn.CloseDeadline(time.Now().Add(closeLimit))
			}
		}
		return Pair{}, err
	}
	return Pair{Pub: pd.conn, Con: conConn, PubCork: pd.cork, ConCork: conCork,
		Abort: func() { abortCon(); pd.abort() }}, nil
}

// ErrLoginDropped is a connection the broker closed during its login
// while it let another log in with the same credential.
var ErrLoginDropped = errors.New("connection dropped during login")

// loginDropped reports whether err is the client library's guess at a
// socket closed during login (not the broker's own refusal, which names
// itself as the server's).
func loginDropped(err error) bool { return errors.Is(err, amqp.ErrCredentials) }
