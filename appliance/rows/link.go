package rows

import (
	"context"
	"errors"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Link is the node's broker link, through which the sync reaches the
// tables' logs: its broker list and failover, TLS settings, client
// certificate and credential are the link's, not the engine's.
type Link interface {
	// Dial opens a connection for role to the broker the link is on now
	// and returns the broker user it logged in as. While the link is not
	// connected it returns an error wrapping ErrLinkDown.
	Dial(ctx context.Context, role string) (conn *amqp.Connection, user string, err error)
	// Moved returns a channel that is closed once the link has moved on
	// from where it is now (another broker, credential or session): a
	// connection dialled after the call is then to be dialled again.
	Moved() <-chan struct{}
}

// ErrLinkDown means the node's broker link is not connected: the sync
// waits for it (Engine.LinkUp).
var ErrLinkDown = errors.New("the node's broker link is not connected")
