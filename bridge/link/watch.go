package link

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Watched is what a session ends on: the node's stop, a new broker
// setting, its connections' and channels' closes, its own failures.
type Watched struct {
	Quit  <-chan struct{}
	URL   string           // the session's broker URL
	Retry <-chan time.Time // look at the URL setting again (nil: never)
	Pub   *Publisher
	// ConnClose, ChClose and AutoClose are the consuming connection's and
	// its channels' (SessionSetup).
	ConnClose, ChClose, AutoClose <-chan *amqp.Error
	Failed                        <-chan error // the first fatal error of a part
}

// Watch waits until the session w describes must end and returns why. A
// new broker setting ends it only when its URL is no longer one of the
// setting's.
func (l *Link) Watch(w Watched) string {
	for {
		select {
		case <-w.Quit:
			return ReasonShutdown
		case <-l.URLChanged():
			if !l.Holds(w.URL) {
				return ReasonURLChanged
			}
		case <-w.Retry:
			if !l.Holds(w.URL) {
				return ReasonURLChanged
			}
		case e := <-w.Pub.ConnClose:
			return l.closed("publishing connection closed", e)
		case e := <-w.ConnClose:
			return l.closed("consuming connection closed", e)
		case e := <-w.Pub.ChClose:
			return l.closed("publish channel closed", e)
		case e := <-w.Pub.FastClose:
			return l.closed("request channel closed", e)
		case e := <-w.AutoClose:
			return l.closed("consume channel closed", e)
		case e := <-w.ChClose:
			return l.closed("consume channel closed", e)
		case err := <-w.Failed:
			return err.Error()
		}
	}
}

// closed is closeReason for one of the session's connections or
// channels. A 404 may be a shared exchange or queue gone: the next
// session checks them again (SessionSetup).
func (l *Link) closed(what string, e *amqp.Error) string {
	if e != nil && e.Code == amqp.NotFound {
		l.ev.Perms.Shared.Store(nil)
	}
	return closeReason(what, e)
}

func closeReason(what string, e *amqp.Error) string {
	if e == nil {
		return what
	}
	return fmt.Sprintf("%s: %d %s", what, e.Code, e.Reason)
}
