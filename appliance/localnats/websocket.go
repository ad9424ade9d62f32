package localnats

import (
	"crypto/tls"
	"fmt"
	"net"
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
// server. It listens on loopback, or with TLS (the appliance's
// configuration checks that). Pages of other origins than those given
// are refused at the upgrade.
type webListener struct {
	addr, cert, key string
	origins         []string
	url             string // ws://host:port or wss://host:port, once applied
}

// WebSocketOptions configure the WebSocket listener.
type WebSocketOptions struct {
	Addr      string // host:port (port 0: a free port)
	Cert, Key string // TLS (wss://) when set
	// Origins are the pages allowed to connect, scheme://host[:port]
	// (none: no page).
	Origins []string
	// OffLoopback says Addr is not on loopback: no client comes in there
	// without a credential.
	OffLoopback bool
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
