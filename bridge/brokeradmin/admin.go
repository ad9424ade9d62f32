package brokeradmin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/meshbox/meshbox/internal/brokerurl"
	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultTimeout bounds one call to the management API.
const DefaultTimeout = 10 * time.Second

// Admin is a checked connection to the management API of the broker, for
// one vhost (the mesh's).
type Admin struct {
	c        *rabbithole.Client
	endpoint string // the admin URL without its credential
	user     string // the admin user
	vhost    string
}

// Options tune Connect.
type Options struct {
	// Timeout bounds each call to the management API (default 10s).
	Timeout time.Duration
}

// Connect checks the admin URL (http(s)://USER:PASSWORD@host:port, the
// management API's base URL) and that the management API answers, accepts
// the credential, and knows the user as an administrator. Every later call
// works on vhost. Its errors say which of these failed (ErrAdminURL,
// ErrNoManagement, ErrUnauthorized, ErrNotAdministrator) and never repeat
// the password.
func Connect(ctx context.Context, adminURL, vhost string, opts Options) (*Admin, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	endpoint, user, pass, err := parseAdminURL(adminURL)
	if err != nil {
		return nil, err
	}
	if vhost == "" {
		return nil, errors.New("broker admin: no vhost")
	}
	// No keep-alives: no transport goroutine outlives a call.
	c, err := rabbithole.NewTLSClient(endpoint, user, pass, &http.Transport{DisableKeepAlives: true})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAdminURL, err)
	}
	c.SetTimeout(opts.Timeout)
	a := &Admin{c: c, endpoint: endpoint, user: user, vhost: vhost}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	who, err := c.Whoami()
	if err != nil {
		return nil, a.explain("check admin credential", err)
	}
	if !slices.Contains(who.Tags, "administrator") {
		return nil, fmt.Errorf("broker admin %s: user %q (tags %q): %w", endpoint, user, strings.Join(who.Tags, ","), ErrNotAdministrator)
	}
	return a, nil
}

// Endpoint returns the management API's URL without the credential.
func (a *Admin) Endpoint() string { return a.endpoint }

// Vhost returns the vhost the Admin works on.
func (a *Admin) Vhost() string { return a.vhost }

// parseAdminURL splits http(s)://user:pass@host:port/prefix into the
// endpoint without credential, the user and the password.
func parseAdminURL(raw string) (endpoint, user, pass string, err error) {
	u, perr := url.Parse(raw)
	if perr != nil {
		// url.Parse's error quotes the input, which holds a password.
		return "", "", "", fmt.Errorf("%w: not a valid URL", ErrAdminURL)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", "", "", fmt.Errorf("%w: scheme must be http or https (the management API, e.g. http://admin:PASSWORD@broker:15672), not %q", ErrAdminURL, u.Scheme)
	}
	if u.Host == "" {
		return "", "", "", fmt.Errorf("%w: has no host", ErrAdminURL)
	}
	p, hasPass := u.User.Password()
	if u.User == nil || u.User.Username() == "" || !hasPass {
		return "", "", "", fmt.Errorf("%w: needs the admin's user and password (http://USER:PASSWORD@%s)", ErrAdminURL, u.Host)
	}
	e := url.URL{Scheme: u.Scheme, Host: u.Host, Path: strings.TrimSuffix(u.Path, "/")}
	return e.String(), u.User.Username(), p, nil
}

// explain turns an error of the management API client into one that says
// what is wrong for an operator.
func (a *Admin) explain(op string, err error) error {
	var resp rabbithole.ErrorResponse
	var netErr net.Error
	switch {
	case strings.Contains(err.Error(), "401"):
		return fmt.Errorf("%s: broker admin %s as %q: %w", op, a.endpoint, a.user, ErrUnauthorized)
	case errors.As(err, &resp) && resp.StatusCode == http.StatusNotFound && op == "check admin credential":
		return fmt.Errorf("%s: %s answers but has no management API (HTTP 404); is this the management port (15672)? %w", op, a.endpoint, ErrNoManagement)
	case errors.As(err, &resp):
		return fmt.Errorf("%s: broker admin %s: HTTP %d: %s %s", op, a.endpoint, resp.StatusCode, resp.Message, resp.Reason)
	case isRefused(err):
		return fmt.Errorf("%s: nothing listens at %s: %w (is the broker running with the rabbitmq_management plugin enabled? rabbitmq-plugins enable rabbitmq_management)",
			op, a.endpoint, ErrNoManagement)
	case errors.As(err, &netErr):
		return fmt.Errorf("%s: reach broker admin %s: %w: %v", op, a.endpoint, ErrNoManagement, err)
	default:
		// A body that is not the API's JSON: some other HTTP server.
		return fmt.Errorf("%s: %s does not answer like RabbitMQ's management API: %w: %v", op, a.endpoint, ErrNoManagement, err)
	}
}

func isRefused(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// VhostOf returns the vhost an amqp(s) URL names ("/" when it names none),
// as AMQP clients read it. Of several URLs separated by commas (the nodes
// of a cluster) it returns the one vhost they all name.
func VhostOf(brokerURL string) (string, error) {
	urls := brokerurl.Split(brokerURL)
	if len(urls) > 1 { // the nodes of a cluster: one vhost
		first, err := VhostOf(urls[0])
		for _, u := range urls[1:] {
			if err != nil {
				break
			}
			var v string
			if v, err = VhostOf(u); err == nil && v != first {
				err = fmt.Errorf("broker URLs: vhost %q differs from the first URL's %q", v, first)
			}
		}
		return first, err
	}
	uri, err := amqp.ParseURI(brokerURL)
	if err != nil {
		return "", errors.New("broker URL: not an amqp:// or amqps:// URL")
	}
	if uri.Vhost == "" {
		return "/", nil
	}
	return uri.Vhost, nil
}
