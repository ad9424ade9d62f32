package doctor

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/meshbox/meshbox/appliance"
	brokerlink "github.com/meshbox/meshbox/bridge/link"
	"github.com/meshbox/meshbox/internal/brokerurl"
	amqp "github.com/rabbitmq/amqp091-go"
)

// brokerURL is the broker the node would use: the configured one, else the
// broker.url setting of the cached bindings with the node's own broker
// credential from them. from says which.
func (d *Doctor) brokerURL() (u, from string) {
	if d.cfg.Broker != "" {
		return string(d.cfg.Broker), "configuration"
	}
	if d.snap != nil {
		if v := d.snap.Bindings.Settings[settingBrokerURL]; v != "" {
			return appliance.NodeBrokerURL(v, d.snap.Bindings.Broker), "the cached bindings"
		}
	}
	return "", ""
}

// checkBroker dials the broker with a short timeout: reachable, and the
// credentials and vhost accepted.
func (d *Doctor) checkBroker(ctx context.Context) Check {
	const name = "broker"
	raw, from := d.brokerURL()
	if raw == "" {
		if d.status != nil {
			if b := d.status.Broker; b.State == "none" && !d.status.Standalone {
				// A node of a mesh without a broker yet: its reason says why.
				return fail(name, "see the node check above and meshbox status", "the running node has no broker: %s", b.Reason)
			}
			if b := d.status.Broker; b.State != "" && b.State != "none" {
				// The running node's own link, as it reports it: the
				// broker it uses, with the credential it holds.
				if b.State == "connected" {
					return ok(name, "the running node's link to %s is connected (since %s)", b.URL, b.Since.UTC().Format(time.RFC3339))
				}
				return fail(name, "see the node's status (meshbox status) and its log", "the running node's link to %s is %s: %s", b.URL, b.State, b.Reason)
			}
		}
		if d.cfg.DB != "" {
			return warn(name, "pass --broker, or let the node cache its bindings once", "broker URL not known: no --broker and no cached broker.url setting")
		}
		return ok(name, "none configured: the node runs standalone")
	}
	urls := brokerurl.Split(raw)
	if len(urls) == 1 {
		conn, c := d.dialBroker(ctx, name, raw, from)
		d.brokerConn = conn // checkCredential looks at it, then closes it
		return c
	}
	// Several brokers (a cluster): each is checked; the node needs one.
	var good, bad []Check
	for _, u := range urls {
		conn, c := d.dialBroker(ctx, name, u, from)
		switch {
		case conn == nil:
			bad = append(bad, c)
		case d.brokerConn == nil:
			d.brokerConn = conn
		default:
			_ = conn.Close()
		}
		if conn != nil {
			good = append(good, c)
		}
	}
	msgs := func(cs []Check) string {
		m := make([]string, len(cs))
		for i, c := range cs {
			m[i] = c.Message
		}
		return strings.Join(m, "; ")
	}
	switch {
	case len(bad) == 0:
		return ok(name, "%d brokers: %s", len(urls), msgs(good))
	case len(good) == 0:
		return fail(name, bad[0].Hint, "none of %d brokers answers: %s", len(urls), msgs(bad))
	default:
		return warn(name, "the node fails over to the brokers that answer; "+bad[0].Hint,
			"%d of %d brokers do not answer: %s", len(bad), len(urls), msgs(bad))
	}
}

// dialBroker dials one broker: a connection and an ok check, or nil and
// a failed check.
func (d *Doctor) dialBroker(ctx context.Context, name, raw, from string) (*amqp.Connection, Check) {
	safe := appliance.RedactURL(raw)
	// The node's own dialer: its TLS settings, CA file and client
	// certificate (EXTERNAL when the URL has no password).
	conn, err := brokerlink.Dial(ctx, brokerlink.DialOptions{
		URL:              raw,
		Name:             "meshbox doctor " + d.cfg.Node,
		CAFile:           d.cfg.Bridge.CAFile,
		CertFile:         d.cfg.Bridge.CertFile,
		KeyFile:          d.cfg.Bridge.KeyFile,
		Heartbeat:        10 * time.Second,
		DialTimeout:      d.timeout,
		HandshakeTimeout: d.timeout,
	})
	switch {
	case errors.Is(err, brokerlink.ErrCAFile):
		return nil, fail(name, "fix bridge.ca_file", "%v", err)
	case errors.Is(err, brokerlink.ErrClientCert):
		return nil, fail(name, "fix bridge.cert_file and bridge.key_file", "%v", err)
	}
	if err != nil {
		var ae *amqp.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp.AccessRefused:
			return nil, fail(name, "the broker refused the user or password in the broker URL; check the node's broker credentials",
				"%s (from %s): credentials refused: %s", safe, from, ae.Reason)
		case errors.As(err, &ae) && ae.Code == amqp.NotAllowed:
			return nil, fail(name, "the user may not use this vhost (or a connection limit is reached); check the broker's permissions",
				"%s (from %s): access refused: %s", safe, from, ae.Reason)
		case isTimeout(err):
			return nil, fail(name, "no answer in time: is the host reachable from here (firewall, VPN)?", "%s (from %s): %v", safe, from, err)
		default:
			return nil, fail(name, "is RabbitMQ running and listening on that host and port, and reachable from here?",
				"%s (from %s): cannot connect: %v", safe, from, err)
		}
	}
	product, _ := conn.Properties["product"].(string)
	version, _ := conn.Properties["version"].(string)
	return conn, ok(name, "%s (from %s) reachable, credentials accepted (%s %s)", safe, from, product, version)
}
