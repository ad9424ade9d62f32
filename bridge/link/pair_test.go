package link

import (
	"errors"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A refused login is the broker's own 403; the client library's guess for
// a socket closed during login (its ErrCredentials) is only a drop when
// the other connection logged in with the same credential.
func TestLoginDropped(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"library's guess", amqp.ErrCredentials, true},
		{"wrapped guess", fmt.Errorf("dial: %w", amqp.ErrCredentials), true},
		{"the broker's refusal", &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED - Login was refused", Server: true}, false},
		{"another error", errors.New("connection reset"), false},
		{"vhost", amqp.ErrVhost, false},
	} {
		if got := loginDropped(tt.err); got != tt.want {
			t.Errorf("%s: loginDropped(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}
