package appliance

import (
	"net"
	"net/url"
	"strings"

	"github.com/meshbox/meshbox/internal/brokerurl"
)

// WeakTransport says what is not protected on the network in the links
// to the broker (brokerURL, amqp:// or amqps://, or several separated by
// commas) and to the mesh database
// (dbURL, postgres://): a plain amqp:// broker on a host other than this
// machine, and a database on another host reached without
// sslmode=verify-full (anything less is open to a man in the middle). An
// empty URL, or one that does not parse, says nothing. The status shows
// the result as warnings and meshbox doctor fails on it.
func WeakTransport(brokerURL, dbURL string) (problems []string) {
	for _, one := range brokerurl.Split(brokerURL) {
		if u, err := url.Parse(one); err == nil && one != "" {
			if u.Scheme == "amqp" && !loopbackHost(u.Hostname()) {
				problems = append(problems, "the broker link to "+u.Host+" is not encrypted (amqp://): use amqps://")
			}
		}
	}
	if host, mode, ok := postgresHost(dbURL); ok && !loopbackHost(host) && mode != "verify-full" {
		if mode == "" {
			mode = "prefer (the default)"
		}
		problems = append(problems, "the database link to "+host+" has sslmode "+mode+
			": use sslmode=verify-full, so that the link is encrypted and the server's certificate and name are checked")
	}
	return problems
}

// postgresHost returns the host and sslmode of a postgres:// URL; ok is
// false when it does not parse. A host given in the query (host=) counts;
// a Unix socket directory is this machine.
func postgresHost(raw string) (host, sslmode string, ok bool) {
	if raw == "" {
		return "", "", false
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", false
	}
	q := u.Query()
	host = u.Hostname()
	if h := q.Get("host"); h != "" {
		host = h
	}
	if host == "" || strings.HasPrefix(host, "/") {
		host = "localhost"
	}
	return host, q.Get("sslmode"), true
}

// loopbackHost reports whether host (a name or an address, no port) is
// this machine's loopback.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// transportWarnings are WeakTransport's findings for the links the node
// uses now.
func (a *Appliance) transportWarnings() []string {
	broker := string(a.cfg.Broker)
	if broker == "" {
		if bd := a.parts().bindings; bd != nil {
			if snap, ok := bd.manager.Current(); ok {
				broker = snap.Bindings.Settings["broker.url"]
			}
		}
	}
	w := WeakTransport(broker, string(a.cfg.DB))
	if w == nil {
		w = []string{}
	}
	return w
}
