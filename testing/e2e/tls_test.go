package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// mentionsCertificate tells whether s names a certificate problem.
func mentionsCertificate(s string) bool {
	s = strings.ToLower(s)
	return strings.Contains(s, "x509") || strings.Contains(s, "certificate")
}

// tlsVhost makes a vhost on the shared broker with TLS and returns its
// name and the AMQPS URL of it as guest.
func tlsVhost(t *testing.T, rmq *meshtest.Rabbit) (name, amqps string) {
	t.Helper()
	plain, err := url.Parse(rmq.Vhost(t))
	if err != nil {
		t.Fatal(err)
	}
	over, err := url.Parse(rmq.TLSURL())
	if err != nil {
		t.Fatal(err)
	}
	if over.Scheme != "amqps" {
		t.Fatalf("TLSURL: got %q, want an amqps:// URL", rmq.TLSURL())
	}
	over.Path, over.RawPath = plain.Path, plain.RawPath
	return strings.TrimPrefix(plain.Path, "/"), over.String()
}

func TestBrokerLinkOverTLS(t *testing.T) {
	t.Parallel()
	rmq := meshtest.RabbitMQTLS(t)
	_, url := tlsVhost(t, rmq)

	// With the broker's CA trusted, the link comes up over TLS.
	withCA := filepath.Join(t.TempDir(), "with-ca.json")
	cfg, err := json.Marshal(map[string]any{"bridge": map[string]string{"ca_file": rmq.CAFile()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(withCA, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	trusting := meshtest.StartProcess(t, "--node", "trusting", "--broker", url, "--config", withCA)
	meshtest.WaitStatus(t, trusting.HTTPURL(), 30*time.Second, "node trusting connected over TLS",
		func(s appliance.Status) bool { return s.Broker.State == "connected" })

	// Without it, the same URL must not connect: the broker's certificate
	// is signed by a CA the node does not know.
	doubting := meshtest.StartProcess(t, "--node", "doubting", "--broker", url)
	var link bridge.BrokerStatus
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		link = meshtest.Status(t, doubting.HTTPURL()).Broker
		if link.State == "connected" {
			t.Fatalf("node without the CA: broker state %q, want not connected", link.State)
		}
	}
	if !mentionsCertificate(link.Reason) && !mentionsCertificate(doubting.Output()) {
		t.Errorf("node without the CA: got state %q reason %q, want a certificate error in the reason or the log\n%s",
			link.State, link.Reason, doubting.Output())
	}
	t.Logf("node without the CA: state %q, reason %q", link.State, link.Reason)

	// The trusting node is still connected: the failure was the other node's.
	if st := meshtest.Status(t, trusting.HTTPURL()); st.Broker.State != "connected" {
		t.Errorf("node with the CA: broker state %q, want connected", st.Broker.State)
	}
}

// A node logs in to the broker with a client certificate (bridge.cert_file
// and bridge.key_file, a broker URL without a password): SASL EXTERNAL,
// the broker taking the user from the certificate.
func TestBrokerLoginWithClientCertificate(t *testing.T) {
	t.Parallel()
	rmq := meshtest.RabbitMQTLS(t)
	vhost, _ := tlsVhost(t, rmq)
	certFile, keyFile := rmq.ClientCert(t, "certnode", vhost)
	file := filepath.Join(t.TempDir(), "cert.json")
	cfg, err := json.Marshal(map[string]any{"bridge": map[string]string{"ca_file": rmq.CAFile(), "cert_file": certFile, "key_file": keyFile}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("amqps://localhost:%d/%s", rmq.TLSPort(), url.PathEscape(vhost)) // no user: the certificate's
	p := meshtest.StartProcess(t, "--node", "certnode", "--broker", url, "--config", file)
	meshtest.WaitStatus(t, p.HTTPURL(), 30*time.Second, "node certnode connected with its certificate",
		func(s appliance.Status) bool { return s.Broker.State == "connected" })
	// The management API lists connections a few seconds late.
	var users []string
	if !meshtest.Poll(30*time.Second, func() bool { users = rmq.ConnectionUsers(t, vhost); return len(users) >= 2 }) {
		t.Fatalf("the broker lists %v, want the node's two connections", users)
	}
	for _, u := range users {
		if u != "certnode" {
			t.Errorf("a connection is logged in as %q, want certnode (the certificate's user)", u)
		}
	}
	// Its messages carry the certificate's user: an event goes out and is
	// accepted by the broker (a wrong user_id would close the channel).
	nc := p.Connect(t)
	r, err := nc.Request("evt.cert.test", []byte("x"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Header.Get("Meshbox-Accepted"); got != "broker" {
		t.Errorf("event accepted as %q, want broker", got)
	}
}
