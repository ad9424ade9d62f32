package meshtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Files of a TLS broker's instance dir.
const (
	tlsCAFile   = "ca.pem"
	tlsCertFile = "server.pem"
	tlsKeyFile  = "server-key.pem"
	tlsCAKey    = "ca-key.pem" // the harness's, to sign client certificates
)

// NewRabbitMQTLS starts a private broker for tb, like NewRabbitMQ, that
// also accepts AMQPS on a loopback port (TLSURL). Its server certificate
// (for localhost and 127.0.0.1, valid a day) is signed by a CA made for
// this broker alone (CAFile). Clients need no certificate; one that
// presents a certificate from ClientCert may log in with it (SASL
// EXTERNAL, the user being the certificate's common name).
//
// A test that does not stop the broker takes the shared one, RabbitMQTLS,
// on a vhost of its own.
func NewRabbitMQTLS(tb testing.TB) *Rabbit {
	tb.Helper()
	return newPrivateRabbit(tb, true)
}

// RabbitMQTLS returns the broker with an AMQPS listener shared by the
// tests of this package (as NewRabbitMQTLS makes one), starting it on
// first use. Main stops it. Tests on it take a vhost each (Vhost) and
// give client certificates' users rights on that vhost alone (ClientCert).
func RabbitMQTLS(tb testing.TB) *Rabbit {
	tb.Helper()
	shared.tlsMu.Lock()
	defer shared.tlsMu.Unlock()
	if shared.tls == nil && shared.tlsE == nil {
		start := time.Now()
		shared.tls, shared.tlsE = newRabbit(true)
		if shared.tlsE == nil {
			tb.Logf("meshtest: shared RabbitMQ with TLS %s ready on %s in %v", shared.tls.node, shared.tls.TLSURL(), time.Since(start).Round(time.Millisecond))
		}
	}
	if shared.tlsE != nil {
		tb.Fatalf("meshtest: shared RabbitMQ with TLS failed to start: %v", shared.tlsE)
	}
	return shared.tls
}

// TLSURL returns the AMQPS URL of the default vhost, with the host name
// the server certificate is made for. Empty unless made by NewRabbitMQTLS.
func (r *Rabbit) TLSURL() string {
	if r.tlsPort == 0 {
		return ""
	}
	return fmt.Sprintf("amqps://guest:guest@localhost:%d/", r.tlsPort)
}

// TLSPort returns the AMQPS port (0 unless made by NewRabbitMQTLS).
func (r *Rabbit) TLSPort() int { return r.tlsPort }

// CAFile returns the path of the PEM file of the CA that signed the
// broker's certificate. Empty unless made by NewRabbitMQTLS.
func (r *Rabbit) CAFile() string {
	if !r.tls {
		return ""
	}
	return filepath.Join(r.dir, tlsCAFile)
}

// tlsConf is the rabbitmq.conf section of the AMQPS listener (empty
// without TLS).
func (r *Rabbit) tlsConf() string {
	if r.tlsPort == 0 {
		return ""
	}
	return fmt.Sprintf(`listeners.ssl.1 = 127.0.0.1:%d
ssl_options.cacertfile = %s
ssl_options.certfile = %s
ssl_options.keyfile = %s
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = AMQPLAIN
auth_mechanisms.3 = EXTERNAL
ssl_cert_login_from = common_name
`, r.tlsPort, filepath.Join(r.dir, tlsCAFile), filepath.Join(r.dir, tlsCertFile), filepath.Join(r.dir, tlsKeyFile))
}

// writeTLSFiles makes a CA and a server certificate signed by it (ECDSA
// P-256, for localhost and 127.0.0.1, valid a day) and writes them and the
// server's key into dir, owned by acc.
func writeTLSFiles(dir string, acc *account) error {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("test CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "meshtest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("test CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return fmt.Errorf("test CA certificate: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("test server key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("test server certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("test server key: %w", err)
	}
	caKeyDER, err := x509.MarshalECPrivateKey(caKey)
	if err != nil {
		return fmt.Errorf("test CA key: %w", err)
	}
	files := []struct {
		name, typ string
		der       []byte
	}{
		{tlsCAFile, "CERTIFICATE", caDER},
		{tlsCertFile, "CERTIFICATE", der},
		{tlsKeyFile, "EC PRIVATE KEY", keyDER},
		{tlsCAKey, "EC PRIVATE KEY", caKeyDER},
	}
	for _, f := range files {
		data := pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der})
		if err := writeOwned(filepath.Join(dir, f.name), data, acc); err != nil {
			return fmt.Errorf("write %s: %w", f.name, err)
		}
	}
	return nil
}

// serial is a random certificate serial number.
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

// ClientCert makes a client certificate for broker user user, signed by
// the broker's CA (valid a day), and the user itself, without a password,
// with every permission on vhost (its name, "/" for the default one): a
// client presenting the certificate logs in as user with SASL EXTERNAL.
// It returns the PEM files of the certificate and its key. Only for a
// broker with TLS (NewRabbitMQTLS, RabbitMQTLS).
func (r *Rabbit) ClientCert(tb testing.TB, user, vhost string) (certFile, keyFile string) {
	tb.Helper()
	if !r.tls {
		tb.Fatal("meshtest: ClientCert needs a broker made by NewRabbitMQTLS")
	}
	caPEM, err := os.ReadFile(filepath.Join(r.dir, tlsCAFile))
	if err != nil {
		tb.Fatalf("meshtest: %v", err)
	}
	caKeyPEM, err := os.ReadFile(filepath.Join(r.dir, tlsCAKey))
	if err != nil {
		tb.Fatalf("meshtest: %v", err)
	}
	caBlock, _ := pem.Decode(caPEM)
	keyBlock, _ := pem.Decode(caKeyPEM)
	if caBlock == nil || keyBlock == nil {
		tb.Fatal("meshtest: the broker's CA files hold no PEM")
	}
	ca, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		tb.Fatalf("meshtest: %v", err)
	}
	caKey, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil {
		tb.Fatalf("meshtest: %v", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("meshtest: client key: %v", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: user},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		tb.Fatalf("meshtest: client certificate: %v", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatalf("meshtest: client key: %v", err)
	}
	dir := tb.TempDir()
	certFile, keyFile = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := r.api(http.MethodPut, "/api/users/"+url.PathEscape(user), map[string]string{"password_hash": "", "tags": ""}); err != nil {
		tb.Fatalf("meshtest: create user %s: %v", user, err)
	}
	perm := map[string]string{"configure": ".*", "write": ".*", "read": ".*"}
	if err := r.api(http.MethodPut, "/api/permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(user), perm); err != nil {
		tb.Fatalf("meshtest: grant %s: %v", user, err)
	}
	return certFile, keyFile
}

// ConnectionUsers returns the broker users of the client connections open
// now on vhost (its name), as the broker knows them (after their login).
func (r *Rabbit) ConnectionUsers(tb testing.TB, vhost string) []string {
	tb.Helper()
	req, err := http.NewRequest(http.MethodGet, r.ManagementURL()+"/api/vhosts/"+url.PathEscape(vhost)+"/connections?columns=user", nil)
	if err != nil {
		tb.Fatal(err)
	}
	req.SetBasicAuth("guest", "guest")
	resp, err := mgmtClient.Do(req)
	if err != nil {
		tb.Fatalf("meshtest: list connections: %v", err)
	}
	defer resp.Body.Close()
	var conns []struct {
		User string `json:"user"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&conns); err != nil {
		tb.Fatalf("meshtest: list connections: %v", err)
	}
	users := make([]string, len(conns))
	for i, c := range conns {
		users[i] = c.User
	}
	return users
}

// TLSFiles writes a test CA and a server certificate it signed, for
// localhost and 127.0.0.1, into a new temporary directory, and returns
// the PEM files of the CA, the certificate and its key.
func TLSFiles(tb testing.TB) (caFile, certFile, keyFile string) {
	tb.Helper()
	dir := tb.TempDir()
	if err := writeTLSFiles(dir, nil); err != nil {
		tb.Fatalf("meshtest: %v", err)
	}
	return filepath.Join(dir, tlsCAFile), filepath.Join(dir, tlsCertFile), filepath.Join(dir, tlsKeyFile)
}
