// Package brokerurl is the one home of the rule that a broker setting
// (the broker.url mesh setting, the node's --broker) names one broker or
// several: the nodes of a RabbitMQ cluster, as URLs separated by commas
// ("amqps://rmq-a:5671/mesh,amqps://rmq-b:5671/mesh"). A comma inside one
// URL must be percent-encoded (%2C). Each package validates the URLs the
// way it needs to; this package only splits, joins and names them.
package brokerurl

import (
	"net/url"
	"strings"
)

// Split returns the URLs of a broker setting, each trimmed of spaces, in
// the order given; nil for "". An empty element (",," or a trailing comma)
// is kept as "" so that validation can refuse it.
func Split(raw string) []string {
	if strings.TrimSpace(raw) == "" {
		return nil
	}
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return parts
}

// Join is the inverse of Split.
func Join(urls []string) string { return strings.Join(urls, ",") }

// Map applies f to each URL of raw and joins the results.
func Map(raw string, f func(string) string) string {
	urls := Split(raw)
	for i, u := range urls {
		urls[i] = f(u)
	}
	return Join(urls)
}

// Host returns where one broker URL points, host:port, with the scheme's
// default port filled in (amqp 5672, amqps 5671); "" when it does not
// parse. It never holds a credential: it is what a status shows.
func Host(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return ""
	}
	if u.Port() != "" {
		return u.Host
	}
	port := "5672"
	if u.Scheme == "amqps" {
		port = "5671"
	}
	host := u.Hostname()
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host + ":" + port
}
