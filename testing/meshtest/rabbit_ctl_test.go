package meshtest

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestCloseUserConnections: every connection of the user is closed by
// the broker; a connection of another user on the same broker stays
// (the control). One at a time: it closes connections on the shared
// broker, of a user of its own.
func TestCloseUserConnections(t *testing.T) {
	r := RabbitMQ(t)
	vhost := r.Vhost(t)
	u, err := url.Parse(vhost)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("meshtest.close.%d", os.Getpid())
	if err := r.api(http.MethodPut, "/api/users/"+url.PathEscape(name), map[string]string{"password": "pw", "tags": ""}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.api(http.MethodDelete, "/api/users/"+url.PathEscape(name), nil) })
	perm := map[string]string{"configure": ".*", "write": ".*", "read": ".*"}
	if err := r.api(http.MethodPut, "/api/permissions/"+strings.TrimPrefix(u.EscapedPath(), "/")+"/"+url.PathEscape(name), perm); err != nil {
		t.Fatal(err)
	}
	asUser := *u
	asUser.User = url.UserPassword(name, "pw")
	dial := func(to string) (*amqp.Connection, chan *amqp.Error) {
		t.Helper()
		c, err := amqp.Dial(to)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c, c.NotifyClose(make(chan *amqp.Error, 1))
	}
	_, closed1 := dial(asUser.String())
	_, closed2 := dial(asUser.String())
	guest, guestClosed := dial(vhost)
	// The management API lists a connection a moment after it opened.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var conns []struct {
			User string `json:"user"`
		}
		if err := r.apiInto(http.MethodGet, "/api/connections", nil, &conns); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range conns {
			if c.User == name {
				n++
			}
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the broker lists %d connections of %s, want 2", n, name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.CloseUserConnections(t, name, "test: closed by the operator")
	for i, ch := range []chan *amqp.Error{closed1, closed2} {
		select {
		case e := <-ch:
			if e == nil || !strings.Contains(e.Reason, "closed by the operator") {
				t.Errorf("connection %d of %s: closed with %v, want the operator's reason", i+1, name, e)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("connection %d of %s still open", i+1, name)
		}
	}
	select {
	case e := <-guestClosed:
		t.Errorf("guest's connection closed too: %v", e)
	case <-time.After(200 * time.Millisecond):
	}
	if guest.IsClosed() {
		t.Error("guest's connection closed, want it open")
	}
}
