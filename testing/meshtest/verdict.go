package meshtest

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// BrokerVerdict runs op on a fresh channel of conn and then a round trip
// on the same channel, so that an asynchronous refusal (a publish) is seen
// too, and returns the broker's error code (0: allowed). A refusal whose
// channel close overtakes the round trip is read from the close
// notification. err is set when the outcome is not an AMQP verdict.
func BrokerVerdict(conn *amqp.Connection, op func(ch *amqp.Channel) error) (code int, err error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	err = op(ch)
	if err == nil {
		// A publish is refused by closing the channel; a synchronous call
		// after it returns that.
		err = ch.Flow(true)
	}
	if err == nil {
		return 0, nil
	}
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return ae.Code, nil
	}
	select {
	case ae := <-closed:
		if ae != nil {
			return ae.Code, nil
		}
	case <-time.After(5 * time.Second):
	}
	return 0, fmt.Errorf("not an AMQP error: %v", err)
}
