package meshtest

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// BrokerVerdict runs op on a fresh channel of conn, then a synchronous
// round trip on the same channel so that an asynchronous refusal (a
// publish the broker turns down closes the channel) is seen too. It
// returns the broker's reply code: 0 when op was allowed, otherwise the
// code the broker closed the channel with (403 access refused, 406
// precondition failed, ...).
//
// When the broker's close overtakes the round trip, the client library
// fails the call with its own "channel not open" error (code 504); the
// broker's code then comes from the close notification, which is what
// this returns.
func BrokerVerdict(conn *amqp.Connection, op func(ch *amqp.Channel) error) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return -1, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err = op(ch); err == nil {
		err = ch.Flow(true)
	}
	if err == nil {
		return 0, nil
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && !errors.Is(err, amqp.ErrClosed) {
		return ae.Code, nil
	}
	select {
	case ae, ok := <-closed:
		if ok && ae != nil {
			return ae.Code, nil
		}
	case <-time.After(5 * time.Second):
	}
	return -1, fmt.Errorf("not a broker refusal: %w", err)
}
