package localnats

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/nats-io/nats-server/v2/server"
)

// The door hands devices to the server in this process only with the
// server's version its createMQTTClient was checked against: after an
// upgrade of nats-server, check (s *Server) createMQTTClient(conn
// net.Conn, ws *websocket) *client in its mqtt.go and set
// inProcessNATSVersion, or devices pass over loopback TCP, slower.
func TestMQTTDoorInProcess(t *testing.T) {
	if !inProcessMQTT() {
		t.Errorf("nats-server %s: the door's in-process hand-over was checked against %s only", server.VERSION, inProcessNATSVersion)
	}
}

// A device's packets reach the server as they were sent, in runs, however
// the device's bytes and the server's reads are cut: a retain past the
// program's limit loses its retain flag, and a QoS 2 publish past it
// ends the stream after what came before it.
func TestDoorReader(t *testing.T) {
	long := strings.Repeat("t", doorReadBuffer+100) // a topic longer than the door's buffer
	pub := func(topic string, payload int, qos byte, id uint16, retain bool) mqttPacket {
		first := byte(mqttPublish<<4) | qos<<1
		if retain {
			first |= mqttPublishRetainFlag
		}
		b := appendMQTTString(nil, []byte(topic))
		if qos > 0 {
			b = binary.BigEndian.AppendUint16(b, id)
		}
		return mqttPacket{first: first, body: append(b, bytes.Repeat([]byte{'x'}, payload)...)}
	}
	pubrel := func(id uint16) mqttPacket {
		return mqttPacket{first: mqttPubRel<<4 | 2, body: binary.BigEndian.AppendUint16(nil, id)}
	}
	in := []mqttPacket{
		pub("evt/a", 5, 0, 0, false),
		pub("evt/r1", 3, 1, 1, true),
		pub("evt/r2", 3, 0, 0, true), // past RetainedMsgs: passed, not retained
		pub(long, 200<<10, 0, 0, false),
		{first: 12 << 4}, // PINGREQ
		pub("evt/q", 1, 2, 7, false),
		pub("evt/q", 1, 2, 7, false), // resent: no new one
		pubrel(7),
		pub("evt/q", 1, 2, 8, false),
		pub("evt/q", 1, 2, 9, false),     // past Inflight (1 unreleased: 8)
		pub("evt/after", 1, 0, 0, false), // never passed
	}
	var sent, want []byte
	for i, p := range in {
		sent = appendMQTTPacket(sent, p)
		if i == 9 {
			continue
		}
		if i < 9 {
			if i == 2 {
				p.first &^= mqttPublishRetainFlag
			}
			want = appendMQTTPacket(want, p)
		}
	}
	lim := programs.MQTTLimits{RetainedMsgs: 1, RetainedBytes: 1 << 20, Inflight: 1, Sessions: 4}
	for _, tc := range []struct {
		name string
		dev  func(io.Reader) io.Reader
		read int
	}{
		{"whole", func(r io.Reader) io.Reader { return r }, 64 << 10},
		{"one byte at a time", iotest.OneByteReader, 512},
		{"halves, small reads", iotest.HalfReader, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &mqttDoor{bounds: newMQTTBounds(t.TempDir(), slog.New(slog.DiscardHandler))}
			if cause := d.bounds.claim("p", "dev", false, &doorConn{}, lim, func(string) bool { return true }); cause != "" {
				t.Fatal(cause)
			}
			r := &doorReader{d: d, br: bufio.NewReaderSize(tc.dev(bytes.NewReader(sent)), doorReadBuffer), program: "p", id: "dev", lim: lim, pre: []byte("CONNECT")}
			var got []byte
			buf := make([]byte, tc.read)
			var err error
			for err == nil {
				var n int
				n, err = r.Read(buf)
				got = append(got, buf[:n]...)
			}
			if !errors.Is(err, errMQTTRefused) {
				t.Errorf("the stream ended with %v, want the refusal", err)
			}
			if !bytes.Equal(got, append([]byte("CONNECT"), want...)) {
				t.Errorf("the server read %d bytes, want %d as sent (retain flag of evt/r2 cleared)", len(got), len("CONNECT")+len(want))
			}
			st := d.bounds.state("p", lim)
			if len(st.Retained) != 1 || st.Retained[0].Topic != "evt/r1" || st.Refused[RefusedRetainedMsgs] != 1 || st.Refused[RefusedInflight] != 1 {
				t.Errorf("state: %+v", st)
			}
		})
	}
}

// A device's QoS 0 message to another device through the door, in this
// process and over loopback TCP, and the door forgets each connection
// when it ends.
func TestMQTTDoorPasses(t *testing.T) {
	n := startMQTTNode(t)
	for _, inProcess := range []bool{true, false} {
		if !inProcess {
			n.door.srv = nil
		}
		round, disconnect := doorRound(t, n.door.ln.Addr().String())
		for range 10 {
			if err := round(); err != nil {
				t.Fatal(err)
			}
		}
		disconnect()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n.door.mu.Lock()
		left := len(n.door.conns)
		n.door.mu.Unlock()
		st := n.door.bounds.state(Anonymous, programs.DefaultMQTTLimits)
		if left == 0 && len(st.Sessions) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the door still tracks %d connections and %d sessions after their clients left", left, len(st.Sessions))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A device with TLS (mqtts://) through the door: the server writes to it
// through the door's TLS.
func TestMQTTDoorTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeTestCert(t, cert, key)
	n, err := Start(Options{Addr: "127.0.0.1:0", Node: "alpha", DataDir: dir, Anonymous: true,
		MQTT: &MQTTOptions{Addr: "127.0.0.1:0", Cert: cert, Key: key}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	addr := n.door.ln.Addr().String()
	round, disconnect := doorRoundOn(t, func() (net.Conn, error) {
		return tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) // the test's own certificate
	})
	defer disconnect()
	for range 10 {
		if err := round(); err != nil {
			t.Fatal(err)
		}
	}
}

// writeTestCert writes a self-signed certificate for 127.0.0.1 and its
// key, PEM.
func writeTestCert(t *testing.T, certFile, keyFile string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "alpha"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkMQTTDoor is a device's QoS 0 message to another device,
// through the door and on the server's own listener (inner).
func BenchmarkMQTTDoor(b *testing.B) {
	n := startMQTTNode(b)
	for _, tc := range []struct{ name, addr string }{{"door", n.door.ln.Addr().String()}, {"inner", n.door.inner}} {
		b.Run(tc.name, func(b *testing.B) {
			round, _ := doorRound(b, tc.addr)
			for b.Loop() {
				if err := round(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func startMQTTNode(tb testing.TB) *Server {
	tb.Helper()
	n, err := Start(Options{Addr: "127.0.0.1:0", Node: "alpha", DataDir: tb.TempDir(), Anonymous: true, MQTT: &MQTTOptions{Addr: "127.0.0.1:0"}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(n.Close)
	return n
}

var doorRounds int

// doorRound connects a subscriber and a publisher without a credential
// to the MQTT listener addr and returns one QoS 0 message from one to
// the other, and their disconnection (at the latest when tb ends).
func doorRound(tb testing.TB, addr string) (round func() error, disconnect func()) {
	tb.Helper()
	return doorRoundOn(tb, func() (net.Conn, error) { return net.Dial("tcp", addr) })
}

// doorRoundOn is doorRound on the connections dial opens.
func doorRoundOn(tb testing.TB, dial func() (net.Conn, error)) (round func() error, disconnect func()) {
	tb.Helper()
	var conns []net.Conn
	disconnect = func() {
		for _, c := range conns {
			_, _ = c.Write([]byte{mqttDisconnect << 4, 0})
			c.Close()
		}
		conns = nil
	}
	tb.Cleanup(disconnect)
	doorRounds++
	topic := "evt/door/" + string(rune('a'+doorRounds%26))
	connect := func(id string) (net.Conn, *bufio.Reader) {
		c, err := dial()
		if err != nil {
			tb.Fatal(err)
		}
		conns = append(conns, c)
		cp := mqttConnectPacket{protocol: "MQTT", level: 4, flags: mqttConnFlagClean, keepAlive: 60, clientID: id}
		if _, err := c.Write(appendMQTTPacket(nil, cp.encode())); err != nil {
			tb.Fatal(err)
		}
		r := bufio.NewReader(c)
		var buf []byte
		if p, err := readMQTTPacket(r, &buf); err != nil || p.kind() != mqttConnAck || p.body[1] != mqttAccepted {
			tb.Fatalf("CONNECT %s: %v %v", id, p, err)
		}
		return c, r
	}
	sub, sr := connect("sub-" + topic)
	pub, _ := connect("pub-" + topic)
	body := binary.BigEndian.AppendUint16(nil, 1)
	body = append(appendMQTTString(body, []byte(topic)), 0)
	if _, err := sub.Write(appendMQTTPacket(nil, mqttPacket{first: 8<<4 | 2, body: body})); err != nil {
		tb.Fatal(err)
	}
	var buf []byte
	if p, err := readMQTTPacket(sr, &buf); err != nil || p.kind() != 9 {
		tb.Fatalf("SUBSCRIBE: %v %v", p, err)
	}
	msg := appendMQTTPacket(nil, mqttPacket{first: mqttPublish << 4, body: append(appendMQTTString(nil, []byte(topic)), "hello"...)})
	return func() error {
		if _, err := pub.Write(msg); err != nil {
			return err
		}
		_ = sub.SetReadDeadline(time.Now().Add(5 * time.Second))
		p, err := readMQTTPacket(sr, &buf)
		if err == nil && p.kind() != mqttPublish {
			err = errors.New("not a PUBLISH")
		}
		return err
	}, disconnect
}

// MQTT over WebSocket would pass no packet through the door: the
// server's WebSocket listener refuses it, to a client without a
// credential on an open node's loopback listeners as to any, while the
// same client gets in on the MQTT listener.
func TestMQTTOverWebSocketRefused(t *testing.T) {
	n, err := Start(Options{Addr: "127.0.0.1:0", Node: "alpha", DataDir: t.TempDir(), Anonymous: true,
		MQTT: &MQTTOptions{Addr: "127.0.0.1:0"}, WebSocket: &WebSocketOptions{Addr: "127.0.0.1:0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	connect := func(broker string) error {
		o := mqtt.NewClientOptions().AddBroker(broker).SetClientID("ws-probe").SetProtocolVersion(4).
			SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(5 * time.Second)
		c := mqtt.NewClient(o)
		tok := c.Connect()
		if !tok.WaitTimeout(10 * time.Second) {
			return errors.New("no answer")
		}
		if tok.Error() == nil {
			c.Disconnect(0)
		}
		return tok.Error()
	}
	if err := connect("tcp://" + n.door.ln.Addr().String()); err != nil {
		t.Fatalf("the control: the MQTT listener refused the client: %v", err)
	}
	ws := n.WebSocketURL() + "/mqtt" // the server's MQTT endpoint on its WebSocket listener
	if err := connect(ws); !errors.Is(err, packets.ErrorRefusedNotAuthorised) {
		t.Errorf("MQTT over WebSocket (%s): got %v, want the sign-in refused", ws, err)
	}
}
