package meshtest

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
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
	vhostURL := r.Vhost(t)
	u, err := url.Parse(vhostURL)
	if err != nil {
		t.Fatal(err)
	}
	vhost := strings.TrimPrefix(u.Path, "/")
	name := fmt.Sprintf("meshtest.close.%d", os.Getpid())
	if err := r.api(http.MethodPut, "/api/users/"+url.PathEscape(name), map[string]string{"password": "pw", "tags": ""}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.api(http.MethodDelete, "/api/users/"+url.PathEscape(name), nil) })
	perm := map[string]string{"configure": ".*", "write": ".*", "read": ".*"}
	if err := r.api(http.MethodPut, "/api/permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(name), perm); err != nil {
		t.Fatal(err)
	}
	asUser := *u
	asUser.User = url.UserPassword(name, "pw")
	closed := []chan *amqp.Error{}
	for range 2 {
		closed = append(closed, Dial(t, asUser.String()).NotifyClose(make(chan *amqp.Error, 1)))
	}
	guest := Dial(t, vhostURL)
	// The management API lists a connection a moment after it opened.
	if !Poll(10*time.Second, func() bool {
		users := r.ConnectionUsers(t, vhost)
		return len(users) == 3 && slices.Contains(users, "guest")
	}) {
		t.Fatalf("the broker lists connections of %v, want two of %s and guest's", r.ConnectionUsers(t, vhost), name)
	}
	r.CloseUserConnections(t, name, "test: closed by the operator")
	for i, ch := range closed {
		select {
		case e := <-ch:
			if e == nil || !strings.Contains(e.Reason, "closed by the operator") {
				t.Errorf("connection %d of %s: closed with %v, want the operator's reason", i+1, name, e)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("connection %d of %s still open", i+1, name)
		}
	}
	time.Sleep(200 * time.Millisecond) // real time: a wrong close of guest's would show by now
	if guest.IsClosed() {
		t.Error("guest's connection closed, want it open")
	}
}
