package brokeradmin_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/bridge/brokeradmin"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// vhostOf returns the vhost name of a harness vhost URL.
func vhostOf(tb testing.TB, amqpURL string) string {
	tb.Helper()
	v, err := brokeradmin.VhostOf(amqpURL)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

// newAdmin connects to the shared broker's management API for a fresh vhost.
func newAdmin(tb testing.TB) (*brokeradmin.Admin, *meshtest.Rabbit, string) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("integration test")
	}
	r := meshtest.RabbitMQ(tb)
	vhost := vhostOf(tb, r.Vhost(tb))
	a, err := brokeradmin.Connect(context.Background(), r.AdminURL(), vhost, brokeradmin.Options{})
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	return a, r, vhost
}

func TestConnectErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	r := meshtest.RabbitMQ(t)
	ctx := context.Background()
	port := strings.TrimPrefix(r.ManagementURL(), "http://127.0.0.1:")
	freeAddr := meshtest.ClosedAddr(t) // nothing listens there

	tests := []struct {
		name     string
		url      string
		want     error
		wantText string
	}{
		{"wrong password", "http://guest:nope@127.0.0.1:" + port, brokeradmin.ErrUnauthorized, "401: wrong admin user or password"},
		{"unknown user", "http://nobody:x@127.0.0.1:" + port, brokeradmin.ErrUnauthorized, "401: wrong admin user or password"},
		{"nothing listening", "http://guest:guest@" + freeAddr, brokeradmin.ErrNoManagement, "rabbitmq_management plugin"},
		{"AMQP port, not the management API", fmt.Sprintf("http://guest:guest@127.0.0.1:%d", r.Port()), brokeradmin.ErrNoManagement, "management API"},
		{"no password", "http://guest@127.0.0.1:" + port, brokeradmin.ErrAdminURL, "needs the admin's user and password"},
		{"amqp scheme", "amqp://guest:guest@127.0.0.1:" + port, brokeradmin.ErrAdminURL, "scheme must be http or https"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := brokeradmin.Connect(ctx, tt.url, "/", brokeradmin.Options{})
			t.Logf("error: %v", err)
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("error %q does not say %q", err, tt.wantText)
			}
			if u, _ := url.Parse(tt.url); u != nil {
				if p, ok := u.User.Password(); ok && strings.Contains(err.Error(), ":"+p+"@") {
					t.Errorf("error %q repeats the password", err)
				}
			}
		})
	}
}

func TestCreateGenerationNeedsVhost(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	r := meshtest.RabbitMQ(t)
	a, err := brokeradmin.Connect(context.Background(), r.AdminURL(), "no-such-vhost-"+t.Name(), brokeradmin.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.CreateGeneration(context.Background(), "n1", 1, []string{"*"})
	if !errors.Is(err, brokeradmin.ErrNoVhost) {
		t.Fatalf("got %v, want ErrNoVhost", err)
	}
}

// TestNeedsNoRuntime: the admin tools take the protocol's names from wire,
// not from the runtime: the package does not import bridge.
func TestNeedsNoRuntime(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "github.com/meshbox/meshbox/bridge" {
			t.Errorf("brokeradmin imports the runtime (bridge); it needs only internal/wire")
		}
	}
	if !strings.Contains(string(out), "github.com/meshbox/meshbox/internal/wire") {
		t.Errorf("brokeradmin does not import internal/wire:\n%s", out)
	}
}
