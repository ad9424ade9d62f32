package appliance

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// A listener is one of the embedded server's doors beside the NATS port
// (WebSocket, MQTT): it sets its part of the server's options.
type listener interface {
	apply(opts *server.Options) error
}

// noOrigin is the origin the WebSocket listener allows when no page may
// connect: the server takes an empty list as "any origin", and a name
// under .invalid (RFC 2606) is no page's origin.
const noOrigin = "https://no-page.invalid"

// wsHandshakeTimeout bounds a WebSocket client's upgrade request.
const wsHandshakeTimeout = 5 * time.Second

// webListener is the WebSocket listener: browser pages with the nats.ws
// client (or any WebSocket NATS client) sign in as programs do on the
// NATS port, with the same credentials and rights; it is the same
// server. It listens on loopback, or with TLS (Config.Validate checks
// that). Pages of other origins than the node's own HTTP listener and
// Config.NATSWebSocketOrigins are refused at the upgrade.
type webListener struct {
	addr, cert, key string
	origins         []string
	url             string // ws://host:port or wss://host:port, once applied
}

// newWebListener is the WebSocket listener of cfg (nil when off);
// httpURL is the node's own HTTP listener ("" when off), whose pages may
// connect.
func newWebListener(cfg *Config, httpURL string) *webListener {
	if cfg.NATSWebSocket == "" {
		return nil
	}
	w := &webListener{addr: cfg.NATSWebSocket, cert: cfg.NATSWebSocketCert, key: cfg.NATSWebSocketKey}
	w.origins = append(w.origins, ownOrigins(httpURL)...)
	w.origins = append(w.origins, cfg.NATSWebSocketOrigins...)
	return w
}

// ownOrigins are the origins of the node's own pages: its HTTP
// listener's address, and localhost for a loopback one.
func ownOrigins(httpURL string) []string {
	u, err := url.Parse(httpURL)
	if httpURL == "" || err != nil || u.Host == "" {
		return nil
	}
	out := []string{u.Scheme + "://" + u.Host}
	if LoopbackAddr(u.Host) {
		out = append(out, u.Scheme+"://localhost:"+u.Port())
	}
	return out
}

func (w *webListener) apply(opts *server.Options) error {
	host, port, err := pickPort(w.addr, "nats_websocket")
	if err != nil {
		return err
	}
	ws := server.WebsocketOpts{
		Host:             host,
		Port:             port,
		NoTLS:            w.cert == "",
		AllowedOrigins:   w.origins,
		HandshakeTimeout: wsHandshakeTimeout,
	}
	if len(ws.AllowedOrigins) == 0 {
		ws.AllowedOrigins = []string{noOrigin}
	}
	scheme := "ws"
	if w.cert != "" {
		tc, err := listenerTLS("nats_websocket", w.cert, w.key)
		if err != nil {
			return err
		}
		ws.TLSConfig, scheme = tc, "wss"
	}
	opts.Websocket = ws
	w.url = scheme + "://" + net.JoinHostPort(host, strconv.Itoa(port))
	return nil
}

// pickPort splits addr (host:port) for a listener of the server that has
// no way to say which port it took: port 0 becomes a free port found now,
// and a port in use is said at once (field names the config field).
func pickPort(addr, field string) (host string, port int, err error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: %w", field, addr, err)
	}
	port, err = strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: bad port", field, addr)
	}
	if port != 0 {
		if err := portFree(host, port, field); err != nil {
			return "", 0, err
		}
		return host, port, nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: %w", field, addr, err)
	}
	port = l.Addr().(*net.TCPAddr).Port
	return host, port, l.Close()
}

// listenerTLS loads the certificate and key of the listener set by field
// (nats_websocket, nats_mqtt) into the server's TLS configuration.
func listenerTLS(field, cert, key string) (*tls.Config, error) {
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cert, KeyFile: key})
	if err != nil {
		return nil, fmt.Errorf("%s TLS (%s_cert %s, %s_key %s): %w", field, field, cert, field, key, err)
	}
	return tc, nil
}
