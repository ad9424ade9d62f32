package appliance_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// TestWebSocketWithTLS: with a certificate the WebSocket listener is
// wss:// (the status says so) and a client that trusts its CA connects;
// one that does not trust it, or speaks plain ws://, does not.
func TestWebSocketWithTLS(t *testing.T) {
	ca, cert, key := meshtest.TLSFiles(t)
	cfg := meshtest.NodeConfig(t, "wss")
	cfg.NATSWebSocket, cfg.NATSWebSocketCert, cfg.NATSWebSocketKey = "127.0.0.1:0", cert, key
	a := meshtest.StartNode(t, cfg)
	u := a.Status().NATS.WebSocket
	if !strings.HasPrefix(u, "wss://127.0.0.1:") {
		t.Fatalf("status nats.websocket %q, want wss://127.0.0.1:<port>", u)
	}
	nc, err := nats.Connect(u, nats.RootCAs(ca), nats.MaxReconnects(0), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("a client that trusts the CA: %v", err)
	}
	nc.Close()
	if nc, err := nats.Connect(u, nats.MaxReconnects(0), nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Error("a client that does not trust the CA connected")
	}
	if nc, err := nats.Connect("ws://"+strings.TrimPrefix(u, "wss://"), nats.MaxReconnects(0), nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Error("a plain ws:// client connected to the TLS listener")
	}
}

// TestWebSocketOffLoopbackNeedsCredentials: a standalone node is open,
// but its WebSocket listener off loopback takes clients from the network,
// and those sign in as programs: a client without a credential (no page:
// it sends no origin) is refused there. The controls: a program's client
// comes in, and so does a client without a credential on the node's
// plain NATS port.
func TestWebSocketOffLoopbackNeedsCredentials(t *testing.T) {
	ca, cert, key := meshtest.TLSFiles(t)
	cfg := meshtest.NodeConfig(t, "wss-lan")
	cfg.NATSWebSocket, cfg.NATSWebSocketCert, cfg.NATSWebSocketKey = "0.0.0.0:0", cert, key
	a := meshtest.StartNode(t, cfg)
	_, port, err := net.SplitHostPort(strings.TrimPrefix(a.Status().NATS.WebSocket, "wss://"))
	if err != nil {
		t.Fatalf("status nats.websocket %q: %v", a.Status().NATS.WebSocket, err)
	}
	u := "wss://127.0.0.1:" + port
	if nc, err := nats.Connect(u, nats.RootCAs(ca), nats.MaxReconnects(0), nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Error("a client without a credential came in on a WebSocket listener off loopback")
	}
	p := programs.Program{Name: "dash", Subscribe: []string{"home.>"}}
	creds := meshtest.AddProgram(t, a.NATSURL(), a.DataDir(), p)
	nc := meshtest.ProgramConn(t, u, creds, p, nats.RootCAs(ca), nats.MaxReconnects(0), nats.Timeout(5*time.Second))
	if _, err := nc.Subscribe("evt.home.x", func(*nats.Msg) {}); err != nil || nc.Flush() != nil {
		t.Errorf("control: a program's client over WebSocket: %v", err)
	}
	if anon, err := nats.Connect(a.NATSURL(), nats.MaxReconnects(0)); err != nil {
		t.Errorf("control: a client without a credential on the NATS port of the open node: %v", err)
	} else {
		anon.Close()
	}
}
