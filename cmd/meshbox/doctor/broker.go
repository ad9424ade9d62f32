package doctor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"os"
	"time"

	"github.com/meshbox/meshbox/appliance"
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
func (d *Doctor) checkBroker(context.Context) Check {
	const name = "broker"
	raw, from := d.brokerURL()
	if raw == "" {
		if d.status != nil {
			if s := d.status.Broker.State; s != "" && s != "none" {
				return ok(name, "not checked here (URL not known to doctor): the node reports the link %s; pass --broker to check it", s)
			}
		}
		if d.cfg.DB != "" {
			return warn(name, "pass --broker, or let the node cache its bindings once", "broker URL not known: no --broker and no cached broker.url setting")
		}
		return ok(name, "none configured: the node runs standalone")
	}
	safe := appliance.RedactURL(raw)
	cfg := amqp.Config{
		Dial:       amqp.DefaultDial(d.timeout),
		Heartbeat:  10 * time.Second,
		Properties: amqp.NewConnectionProperties(),
	}
	cfg.Properties.SetClientConnectionName("meshbox doctor " + d.cfg.Node)
	if d.cfg.Bridge.CAFile != "" {
		pem, err := os.ReadFile(d.cfg.Bridge.CAFile)
		if err != nil {
			return fail(name, "fix bridge.ca_file", "read CA file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fail(name, "fix bridge.ca_file", "%s holds no PEM certificate", d.cfg.Bridge.CAFile)
		}
		cfg.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if d.cfg.Bridge.CertFile != "" {
		// The node logs in with its client certificate (EXTERNAL) when
		// the URL has no password: so does doctor.
		cert, err := tls.LoadX509KeyPair(d.cfg.Bridge.CertFile, d.cfg.Bridge.KeyFile)
		if err != nil {
			return fail(name, "fix bridge.cert_file and bridge.key_file", "client certificate: %v", err)
		}
		if cfg.TLSClientConfig == nil {
			cfg.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		cfg.TLSClientConfig.Certificates = []tls.Certificate{cert}
		if u, err := url.Parse(raw); err == nil && u.Scheme == "amqps" {
			if _, has := u.User.Password(); !has {
				cfg.SASL = []amqp.Authentication{&amqp.ExternalAuth{}}
			}
		}
	}
	conn, err := amqp.DialConfig(raw, cfg)
	if err != nil {
		var ae *amqp.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp.AccessRefused:
			return fail(name, "the broker refused the user or password in the broker URL; check the node's broker credentials",
				"%s (from %s): credentials refused: %s", safe, from, ae.Reason)
		case errors.As(err, &ae) && ae.Code == amqp.NotAllowed:
			return fail(name, "the user may not use this vhost (or a connection limit is reached); check the broker's permissions",
				"%s (from %s): access refused: %s", safe, from, ae.Reason)
		case isTimeout(err):
			return fail(name, "no answer in time: is the host reachable from here (firewall, VPN)?", "%s (from %s): %v", safe, from, err)
		default:
			return fail(name, "is RabbitMQ running and listening on that host and port, and reachable from here?",
				"%s (from %s): cannot connect: %v", safe, from, err)
		}
	}
	d.brokerConn = conn // checkCredential looks at it, then closes it
	product, _ := conn.Properties["product"].(string)
	version, _ := conn.Properties["version"].(string)
	return ok(name, "%s (from %s) reachable, credentials accepted (%s %s)", safe, from, product, version)
}
