package bridge

import (
	"crypto/tls"
	"net/url"

	brokerlink "github.com/meshbox/meshbox/bridge/link"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A node may log in to the broker with a client certificate instead of a
// password: Config.CertFile and Config.KeyFile name it, and a broker URL
// without a password then logs in with SASL EXTERNAL (RabbitMQ's
// rabbitmq_auth_mechanism_ssl plugin), the broker taking the user from the
// certificate (by default its common name). The user is the URL's when it
// names one, else the certificate's common name: it is the user_id every
// message carries, which the broker checks against the login.

// clientCert loads Config's client certificate; nil without one.
func (b *Bridge) clientCert() (*tls.Certificate, error) {
	return brokerlink.LoadClientCert(b.cfg.CertFile, b.cfg.KeyFile)
}

// externalLogin reports whether a connection to raw logs in with
// Config's client certificate (EXTERNAL).
func (b *Bridge) externalLogin(raw string) bool { return brokerlink.ExternalLogin(b.cfg.CertFile, raw) }

// loginUser is the broker user a connection to raw is known as.
func (b *Bridge) loginUser(raw string, uri amqp.URI) string {
	if !b.externalLogin(raw) {
		return uri.Username
	}
	if u, err := url.Parse(raw); err == nil && u.User != nil && u.User.Username() != "" {
		return u.User.Username()
	}
	if cert, err := b.clientCert(); err == nil && cert != nil && cert.Leaf != nil {
		return cert.Leaf.Subject.CommonName
	}
	return uri.Username
}
