package meshtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// Files of a TLS broker's instance dir.
const (
	tlsCAFile   = "ca.pem"
	tlsCertFile = "server.pem"
	tlsKeyFile  = "server-key.pem"
)

// NewRabbitMQTLS starts a private broker for tb, like NewRabbitMQ, that
// also accepts AMQPS on a loopback port (TLSURL). Its server certificate
// (for localhost and 127.0.0.1, valid a day) is signed by a CA made for
// this broker alone (CAFile); clients are not asked for certificates.
func NewRabbitMQTLS(tb testing.TB) *Rabbit {
	tb.Helper()
	return newPrivateRabbit(tb, true)
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
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
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
	files := []struct {
		name, typ string
		der       []byte
	}{
		{tlsCAFile, "CERTIFICATE", caDER},
		{tlsCertFile, "CERTIFICATE", der},
		{tlsKeyFile, "EC PRIVATE KEY", keyDER},
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
