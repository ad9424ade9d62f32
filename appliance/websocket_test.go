package appliance_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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
