package localnats

import (
	"crypto/tls"
	"fmt"
	"net"
	"strconv"

	"github.com/nats-io/nats-server/v2/server"
)

// mqttMaxStore bounds JetStream's file store when only MQTT uses it (the
// blob store off): the server keeps MQTT sessions, retained messages and
// QoS 1 messages not yet acknowledged in streams of its own.
const mqttMaxStore = 256 << 20

// WarnMQTTPlain is the status warning of an MQTT listener off loopback
// without TLS (%s: its address).
const WarnMQTTPlain = "the MQTT listener on %s has no TLS: devices' passwords cross the network in the clear (set nats_mqtt_cert and nats_mqtt_key for mqtts://)"

// mqttListener is the MQTT listener: devices sign in as programs that
// have an MQTT password (programs.Program.MQTT), with the same rights as
// on the NATS port; an MQTT topic is a NATS subject with '/' for '.'
// (evt/home/kitchen/temp is evt.home.kitchen.temp), the server's own
// mapping. The node's door (mqttdoor.go) listens on addr, with TLS when
// set, and passes devices to the server's own MQTT listener on loopback
// (inner). The server needs JetStream for MQTT: it runs beside the blob
// store's, or alone in the data directory when the blob store is off.
type mqttListener struct {
	addr, cert, key, dataDir string
	offLoopback              bool   // addr takes clients from the network
	url                      string // mqtt://host:port or mqtts://host:port, once applied
	// ln is the door's listener and tc its TLS, once applied; inner the
	// server's listener.
	ln    net.Listener
	tc    *tls.Config
	inner string
}

// MQTTOptions configure the MQTT listener.
type MQTTOptions struct {
	Addr      string // host:port (port 0: a free port)
	Cert, Key string // TLS (mqtts://) when set
	// OffLoopback says Addr is not on loopback: no client comes in there
	// without a credential, and without TLS the status warns
	// (WarnMQTTPlain).
	OffLoopback bool
}

func (m *mqttListener) apply(opts *server.Options) error {
	host, port, err := pickPort(m.addr, "nats_mqtt")
	if err != nil {
		return err
	}
	scheme := "mqtt"
	if m.cert != "" {
		if m.tc, err = listenerTLS("nats_mqtt", m.cert, m.key); err != nil {
			return err
		}
		scheme = "mqtts"
	}
	innerHost, innerPort, err := pickPort("127.0.0.1:0", "nats_mqtt")
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("nats_mqtt address %s: %w", m.addr, err)
	}
	port = ln.Addr().(*net.TCPAddr).Port
	m.ln = ln
	m.inner = net.JoinHostPort(innerHost, strconv.Itoa(innerPort))
	opts.MQTT = server.MQTTOpts{Host: innerHost, Port: innerPort}
	if !opts.JetStream {
		opts.JetStream = true
		opts.StoreDir = jetStreamDir(m.dataDir)
		opts.JetStreamMaxStore = mqttMaxStore
		opts.JetStreamMaxMemory = jsMaxMemory
		opts.DisableJetStreamBanner = true
	}
	m.url = scheme + "://" + net.JoinHostPort(host, strconv.Itoa(port))
	return nil
}

// plain reports whether device passwords cross a network in the clear:
// no TLS, off loopback.
func (m *mqttListener) plain() bool { return m.cert == "" && m.offLoopback }
