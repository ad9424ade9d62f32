package link

import (
	"net/url"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A node may log in to the broker with a client certificate instead of a
// password: certFile and keyFile name it, and a broker URL without a
// password then logs in with SASL EXTERNAL (RabbitMQ's
// rabbitmq_auth_mechanism_ssl plugin), the broker taking the user from the
// certificate (by default its common name). The user is the URL's when it
// names one, else the certificate's common name: it is the user_id every
// message carries, which the broker checks against the login.

// LoginUser is the broker user a connection to raw (parsed: uri) is known
// as, with the client certificate certFile and keyFile ("": none).
func LoginUser(certFile, keyFile, raw string, uri amqp.URI) string {
	if !ExternalLogin(certFile, raw) {
		return uri.Username
	}
	if u, err := url.Parse(raw); err == nil && u.User != nil && u.User.Username() != "" {
		return u.User.Username()
	}
	if cert, err := LoadClientCert(certFile, keyFile); err == nil && cert != nil && cert.Leaf != nil {
		return cert.Leaf.Subject.CommonName
	}
	return uri.Username
}
