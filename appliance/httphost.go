package appliance

import (
	"net"
	"net/http"
	"strings"
)

// hostGuard answers only requests whose Host is a name the HTTP server
// serves: loopback names and addresses, the address it listens on, and
// the names of Config.HTTPHosts (a reverse proxy's). Anything else gets
// 421 Misdirected Request. This stops DNS rebinding: a web page from
// evil.example whose name a hostile DNS server points at 127.0.0.1 makes
// the browser send "Host: evil.example", and the node does not answer it.
type hostGuard struct {
	listen net.IP // the listener's address; unspecified (0.0.0.0, ::) allows every address literal
	names  map[string]bool
	next   http.Handler
}

// newHostGuard guards next for a listener on listen (host:port).
func newHostGuard(listen string, extra []string, next http.Handler) *hostGuard {
	g := &hostGuard{names: map[string]bool{"localhost": true}, next: next}
	if host, _, err := net.SplitHostPort(listen); err == nil {
		if ip := net.ParseIP(host); ip != nil {
			g.listen = ip
		} else if host != "" {
			g.names[strings.ToLower(host)] = true
		}
	}
	for _, h := range extra {
		g.names[strings.ToLower(strings.TrimSuffix(h, "."))] = true
	}
	return g
}

// allowed reports whether the Host header host (with or without a port)
// is one the server serves.
func (g *hostGuard) allowed(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSuffix(host, "]"), "["), ".")
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback() || (g.listen != nil && (g.listen.IsUnspecified() || g.listen.Equal(ip)))
	}
	return g.names[strings.ToLower(host)]
}

func (g *hostGuard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !g.allowed(r.Host) {
		http.Error(w, "meshbox: this node does not serve the host name "+clipHost(r.Host)+
			" (add it to http_hosts if a proxy uses it)", http.StatusMisdirectedRequest)
		return
	}
	g.next.ServeHTTP(w, r)
}

// clipHost keeps an echoed Host short and printable.
func clipHost(h string) string {
	if len(h) > 64 {
		h = h[:64]
	}
	return strings.Map(func(r rune) rune {
		if r < ' ' || r > '~' {
			return '?'
		}
		return r
	}, h)
}
