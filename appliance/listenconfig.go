package appliance

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// The checks of the embedded NATS server's listeners beside its NATS
// port (WebSocket, MQTT): kept apart from config.go, which holds the
// configuration's fields, layers and the checks of the rest.

// checkWebSocket checks the WebSocket listener's fields: an address, TLS
// off loopback (a certificate and its key, both readable), and origins
// that are scheme://host[:port] of http or https.
func (c *Config) checkWebSocket() []*FieldError {
	var errs []*FieldError
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Err: fmt.Errorf(format, args...)})
	}
	if c.NATSWebSocket == "" {
		if c.NATSWebSocketCert != "" || c.NATSWebSocketKey != "" || len(c.NATSWebSocketOrigins) > 0 {
			bad("nats_websocket", "empty (no WebSocket listener), but nats_websocket_cert, _key or _origins are set: give it an address (host:port)")
		}
		return errs
	}
	if err := checkHostPort(c.NATSWebSocket); err != nil {
		bad("nats_websocket", "%v", err)
	} else if c.NATSWebSocket == c.NATS && !strings.HasSuffix(c.NATS, ":0") {
		bad("nats_websocket", "%s is the NATS listener's address too: give it a port of its own", c.NATSWebSocket)
	}
	for _, e := range checkFiles("nats_websocket_cert", c.NATSWebSocketCert, "nats_websocket_key", c.NATSWebSocketKey) {
		errs = append(errs, e)
	}
	if c.NATSWebSocketCert == "" && !LoopbackAddr(c.NATSWebSocket) {
		bad("nats_websocket", "%s is not a loopback address and the listener has no TLS: set nats_websocket_cert and nats_websocket_key (wss://), or listen on 127.0.0.1", c.NATSWebSocket)
	}
	for i, o := range c.NATSWebSocketOrigins {
		if err := checkOrigin(o); err != nil {
			bad(fmt.Sprintf("nats_websocket_origins[%d]", i), "%v", err)
		}
	}
	return errs
}

// checkOrigin checks a web origin: scheme://host[:port], http or https,
// nothing after the host.
func checkOrigin(o string) error {
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an origin (http://host[:port] or https://host[:port])", o)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("%q is not an origin: give the scheme, host and port only (%s://%s)", o, u.Scheme, u.Host)
	}
	return nil
}

// checkMQTT checks the MQTT listener's fields: an address of its own,
// and a certificate with its key or neither.
func (c *Config) checkMQTT() []*FieldError {
	if c.NATSMQTT == "" {
		if c.NATSMQTTCert != "" || c.NATSMQTTKey != "" {
			return []*FieldError{{Field: "nats_mqtt", Err: errors.New("empty (no MQTT listener), but nats_mqtt_cert or _key are set: give it an address (host:port)")}}
		}
		return nil
	}
	var errs []*FieldError
	if err := checkHostPort(c.NATSMQTT); err != nil {
		errs = append(errs, &FieldError{Field: "nats_mqtt", Err: err})
	} else if !strings.HasSuffix(c.NATSMQTT, ":0") && (c.NATSMQTT == c.NATS || c.NATSMQTT == c.NATSWebSocket) {
		errs = append(errs, &FieldError{Field: "nats_mqtt", Err: fmt.Errorf("%s is another listener's address too: give it a port of its own", c.NATSMQTT)})
	}
	return append(errs, checkFiles("nats_mqtt_cert", c.NATSMQTTCert, "nats_mqtt_key", c.NATSMQTTKey)...)
}

// checkFiles checks a certificate and its key: both or neither, each a
// file that exists.
func checkFiles(certField, cert, keyField, key string) []*FieldError {
	var errs []*FieldError
	if (cert == "") != (key == "") {
		errs = append(errs, &FieldError{Field: certField, Err: fmt.Errorf("a certificate needs its key and a key its certificate: set both %s and %s", certField, keyField)})
	}
	for _, f := range []struct{ field, path string }{{certField, cert}, {keyField, key}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			errs = append(errs, &FieldError{Field: f.field, Err: err})
		}
	}
	return errs
}
