package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbox/meshbox/appliance/localnats"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// The attacks of one MQTT device on the node's store, each stopped at its
// program's limit (the node's MQTT door), each beside its control: another
// device that connects and does what it should, and a blob put that
// succeeds.

// boundsNode starts a standalone node with an MQTT listener and the blob
// store, and defines programs through the CLI, each `program add` with
// its arguments (the name first).
func boundsNode(t *testing.T, progs ...[]string) *meshtest.Process {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a node")
	}
	p := meshtest.StartProcessEnv(t, []string{"MESHBOX_NATS_MQTT=127.0.0.1:0"}, "--node", "bounds")
	for _, args := range progs {
		if code, out, errOut := programCLI(t, p, append([]string{"add"}, args...)...); code != 0 {
			t.Fatalf("program add %v: exit %d %s %s", args, code, out, errOut)
		}
	}
	return p
}

// programCLI runs meshbox program ARGS against node p.
func programCLI(t *testing.T, p *meshtest.Process, args ...string) (int, string, string) {
	t.Helper()
	return cli(t, append(append([]string{"program"}, args...), "--data", p.DataDir(), "--server", p.NATSURL(),
		"--creds", filepath.Join(p.DataDir(), programs.AdminFile))...)
}

// programMQTT is `meshbox program mqtt NAME --json` on p.
func programMQTT(t *testing.T, p *meshtest.Process, name string) localnats.MQTTProgramState {
	t.Helper()
	code, out, errOut := programCLI(t, p, "mqtt", name, "--json")
	if code != 0 {
		t.Fatalf("program mqtt %s: exit %d %s %s", name, code, out, errOut)
	}
	var st localnats.MQTTProgramState
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("program mqtt %s --json: %v in %q", name, err, out)
	}
	return st
}

// blobPutWorks is the control every attack keeps: a blob put on p
// succeeds.
func blobPutWorks(t *testing.T, p *meshtest.Process) {
	t.Helper()
	file, _ := randomBlobFile(t, 256<<10)
	if code, out, errOut := blobCLI(t, p, time.Minute, "put", file); code != 0 {
		t.Errorf("blob put after the attack: exit %d %s %s", code, out, errOut)
	}
}

// streamMsgs is how many messages stream holds on p's server.
func streamMsgs(t *testing.T, p *meshtest.Process, stream string) uint64 {
	t.Helper()
	nc := meshtest.AdminConn(t, p.NATSURL(), p.DataDir())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	return st.CachedInfo().State.Msgs
}

// pahoClient connects to p's MQTT listener as program name with client
// ID id (the attacker's tool: a Go MQTT client that publishes fast).
func pahoClient(t *testing.T, p *meshtest.Process, name, id string) mqtt.Client {
	t.Helper()
	c := mqttOf(t, p, name)
	o := mqtt.NewClientOptions().AddBroker("tcp://" + net.JoinHostPort(c.host, c.port)).SetClientID(id).
		SetUsername(c.user).SetPassword(c.password).SetAutoReconnect(false).SetProtocolVersion(4)
	cl := mqtt.NewClient(o)
	if tok := cl.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("%s connects as %s: %v", id, name, tok.Error())
	}
	t.Cleanup(func() { cl.Disconnect(100) })
	return cl
}

// TestMQTTBoundsRetainedFlood: a device retains 48 messages of 64 KiB on
// topics of its own; its program keeps 256 KiB of retained messages, so a
// later subscriber gets 4 of them, the rest went to subscribers and were
// not kept; the node counts the refusals under the program. Its control:
// another device's retained message is kept, and a blob put succeeds.
func TestMQTTBoundsRetainedFlood(t *testing.T) {
	p := boundsNode(t,
		[]string{"flood", "--mqtt", "--publish", "flood.>", "--mqtt-retained", "256KiB"},
		[]string{"calm", "--mqtt", "--publish", "calm.>", "--subscribe", "calm.>"},
		[]string{"reader", "--mqtt", "--subscribe", "flood.>"})
	const n, size = 48, 64 << 10
	cl := pahoClient(t, p, "flood", "flood-1")
	payload := strings.Repeat("x", size)
	for i := range n {
		tok := cl.Publish(fmt.Sprintf("evt/flood/t%d/config", i), 1, true, payload)
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("flood's retained publish %d: %v", i, tok.Error())
		}
	}
	// What a later subscriber gets: the retained messages the store kept.
	reader := mqttOf(t, p, "reader")
	_, out := runMQTT(t, "mosquitto_sub", append(reader.args("reader-1"), "-q", "1", "-t", "evt/flood/#", "-W", "3", "-F", "%t %l"), 20*time.Second)
	kept := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "evt/flood/") {
			kept++
		}
	}
	if kept > 4 {
		t.Errorf("a later subscriber got %d of flood's retained messages, want at most 4 (256 KiB of 64 KiB ones)", kept)
	}
	if kept == 0 {
		t.Errorf("a later subscriber got none of flood's retained messages, want those within its limit")
	}
	st := programMQTT(t, p, "flood")
	if st.RetainedBytes > 256<<10 || st.Refused[localnats.RefusedRetainedBytes] == 0 {
		t.Errorf("program mqtt flood: %d bytes retained, refused %v; want at most 256 KiB and retained_bytes refusals", st.RetainedBytes, st.Refused)
	}
	if !strings.Contains(metricsText(t, p), `meshbox_mqtt_refused_total{cause="retained_bytes",program="flood"}`) {
		t.Errorf("no meshbox_mqtt_refused_total for flood's retained_bytes")
	}

	// The control: another device retains, and a later subscriber gets it.
	calm := mqttOf(t, p, "calm")
	if code, out := calm.pub(t, "calm-1", "evt/calm/state", "ON", true); code != 0 {
		t.Fatalf("calm's retained publish: exit %d %s", code, out)
	}
	_, out = runMQTT(t, "mosquitto_sub", append(calm.args("calm-2"), "-q", "1", "-t", "evt/calm/state", "-C", "1", "-W", "5"), 20*time.Second)
	if strings.TrimSpace(out) != "ON" {
		t.Errorf("a later subscriber of calm's retained state got %q, want ON", out)
	}
	blobPutWorks(t, p)

	// The admin clears flood's retained messages: a later subscriber gets none.
	if code, out, errOut := programCLI(t, p, "mqtt-clear", "flood", "--retained"); code != 0 {
		t.Fatalf("program mqtt-clear flood: exit %d %s %s", code, out, errOut)
	}
	_, out = runMQTT(t, "mosquitto_sub", append(reader.args("reader-2"), "-q", "1", "-t", "evt/flood/#", "-W", "2"), 20*time.Second)
	if strings.Contains(out, "x") {
		t.Errorf("after mqtt-clear, a later subscriber still got flood's retained messages")
	}
}

// metricsText is p's /metrics page.
func metricsText(t *testing.T, p *meshtest.Process) string {
	t.Helper()
	resp, err := http.Get(p.HTTPURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// rawMQTT is an MQTT 3.1.1 connection written by hand: the attacker of
// the QoS 2 flood sends publishes a library would complete.
type rawMQTT struct {
	c net.Conn
	r *bufio.Reader
}

func dialRawMQTT(t *testing.T, p *meshtest.Process, name, id string) *rawMQTT {
	t.Helper()
	m := mqttOf(t, p, name)
	c, err := net.DialTimeout("tcp", net.JoinHostPort(m.host, m.port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var body []byte
	str := func(s string) { body = binary.BigEndian.AppendUint16(body, uint16(len(s))); body = append(body, s...) }
	str("MQTT")
	body = append(body, 4, 0xC2, 0, 60) // level 4; user, password, clean session; keep alive 60 s
	str(id)
	str(m.user)
	str(m.password)
	raw := &rawMQTT{c: c, r: bufio.NewReader(c)}
	raw.send(t, 0x10, body)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	ack := make([]byte, 4)
	if _, err := io.ReadFull(raw.r, ack); err != nil || ack[0] != 0x20 || ack[3] != 0 {
		t.Fatalf("%s's CONNACK: % x, %v", id, ack, err)
	}
	return raw
}

func (m *rawMQTT) send(t *testing.T, first byte, body []byte) error {
	t.Helper()
	pkt := []byte{first}
	for n := len(body); ; {
		b := byte(n % 128)
		if n /= 128; n > 0 {
			b |= 0x80
		}
		pkt = append(pkt, b)
		if n == 0 {
			break
		}
	}
	_, err := m.c.Write(append(pkt, body...))
	return err
}

// TestMQTTBoundsQoS2Flood: a device starts 200 QoS 2 publishes and
// releases none; its program may hold 8, so the server holds at most 8
// of them and the door closes the connection at the ninth. Its control:
// another device's QoS 2 publish completes and reaches a subscriber, and
// a blob put succeeds.
func TestMQTTBoundsQoS2Flood(t *testing.T) {
	p := boundsNode(t,
		[]string{"flood", "--mqtt", "--publish", "flood.>", "--mqtt-inflight", "8"},
		[]string{"calm", "--mqtt", "--publish", "calm.>", "--subscribe", "calm.>"})
	raw := dialRawMQTT(t, p, "flood", "flood-q2")
	payload := strings.Repeat("y", 32<<10)
	sent := 0
	for pi := 1; pi <= 200; pi++ {
		var body []byte
		body = binary.BigEndian.AppendUint16(body, uint16(len("evt/flood/q2")))
		body = append(body, "evt/flood/q2"...)
		body = binary.BigEndian.AppendUint16(body, uint16(pi))
		body = append(body, payload...)
		if raw.send(t, 0x34, body) != nil { // PUBLISH, QoS 2
			break
		}
		sent++
	}
	// The door closes the connection; read what the server answered until then.
	_ = raw.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	pubrecs := 0
	for {
		b, err := raw.r.ReadByte()
		if err != nil {
			break
		}
		n, _ := raw.r.ReadByte()
		if _, err := raw.r.Discard(int(n)); err != nil {
			break
		}
		if b>>4 == 5 {
			pubrecs++
		}
	}
	if held := streamMsgs(t, p, "$MQTT_qos2in"); held > 8 {
		t.Errorf("the server holds %d unreleased QoS 2 publishes of flood (it sent %d, got %d PUBRECs), want at most 8", held, sent, pubrecs)
	}
	if st := programMQTT(t, p, "flood"); st.Refused[localnats.RefusedInflight] == 0 {
		t.Errorf("program mqtt flood: refused %v, want inflight", st.Refused)
	}

	// The control: another device's QoS 2 publish completes and arrives.
	calm := mqttOf(t, p, "calm")
	sub := calm.sub(t, "calm-sub", "evt/calm/#")
	meshtest.WaitFor(t, 10*time.Second, "calm's subscriber is in place", func() bool {
		code, _ := runMQTT(t, "mosquitto_pub", append(calm.args("calm-pub"), "-q", "2", "-t", "evt/calm/q2", "-m", "done"), 15*time.Second)
		return code == 0 && sub.has("evt/calm/q2", "done")
	})
	blobPutWorks(t, p)
}

// TestMQTTBoundsSessionFlood: a device stores sessions under ever new
// client IDs; its program may hold 3, so the fourth is refused at
// CONNECT and the server keeps 3. Its controls: a device of the program
// goes on resuming a session it holds; another program's device stores
// its session and resumes it; a blob put succeeds; and once the admin
// ends flood's sessions, a new one is taken.
func TestMQTTBoundsSessionFlood(t *testing.T) {
	p := boundsNode(t,
		[]string{"flood", "--mqtt", "--subscribe", "flood.>", "--mqtt-sessions", "3"},
		[]string{"calm", "--mqtt", "--subscribe", "calm.>"})
	flood, calm := mqttOf(t, p, "flood"), mqttOf(t, p, "calm")
	stored := func(c mqttClient, id string) (int, string) {
		return runMQTT(t, "mosquitto_sub", append(c.args(id), "-c", "-q", "1", "-t", "evt/"+c.user+"/x", "-E"), 15*time.Second)
	}
	taken := 0
	for i := range 10 {
		if code, _ := stored(flood, fmt.Sprintf("flood-%d", i)); code == 0 {
			taken++
		}
	}
	if taken != 3 {
		t.Errorf("flood stored %d sessions of 10, want 3", taken)
	}
	if code, out := stored(flood, "flood-0"); code != 0 {
		t.Errorf("flood resumes its session flood-0: exit %d %s", code, out)
	}
	if st := programMQTT(t, p, "flood"); len(st.Sessions) != 3 || st.Refused[localnats.RefusedSessions] == 0 {
		t.Errorf("program mqtt flood: %d sessions, refused %v; want 3 and sessions refusals", len(st.Sessions), st.Refused)
	}
	if code, out := stored(calm, "calm-1"); code != 0 {
		t.Errorf("calm stores its session: exit %d %s", code, out)
	}
	if code, out := stored(calm, "calm-1"); code != 0 {
		t.Errorf("calm resumes its session: exit %d %s", code, out)
	}
	if n := streamMsgs(t, p, "$MQTT_sess"); n > 4 {
		t.Errorf("the server stores %d sessions, want flood's 3 and calm's 1", n)
	}
	blobPutWorks(t, p)

	if code, out, errOut := programCLI(t, p, "mqtt-clear", "flood", "--sessions"); code != 0 || !strings.Contains(out, "3 sessions ended") {
		t.Fatalf("program mqtt-clear flood --sessions: exit %d %q %s", code, out, errOut)
	}
	if code, out := stored(flood, "flood-new"); code != 0 {
		t.Errorf("flood stores a session after the admin ended its others: exit %d %s", code, out)
	}
}

// TestMQTTClientIDOfAnotherProgram: a device of program thief connects
// with the client ID a device of program owner is connected with; it is
// refused (identifier rejected), and owner's device stays connected and
// goes on receiving. Its control: thief connects with a client ID of its
// own, and owner's device reconnects with its own.
func TestMQTTClientIDOfAnotherProgram(t *testing.T) {
	p := boundsNode(t,
		[]string{"owner", "--mqtt", "--publish", "owner.>", "--subscribe", "owner.>"},
		[]string{"thief", "--mqtt", "--publish", "thief.>", "--subscribe", "thief.>"})
	owner, thief := mqttOf(t, p, "owner"), mqttOf(t, p, "thief")
	sub := owner.sub(t, "plug-kitchen", "evt/owner/#")
	meshtest.WaitFor(t, 10*time.Second, "owner's device receives", func() bool {
		_, _ = owner.pub(t, "owner-pub", "evt/owner/state", "before", false)
		return sub.has("evt/owner/state", "before")
	})
	code, out := thief.pub(t, "plug-kitchen", "evt/thief/x", "taken", false)
	if code == 0 || !strings.Contains(strings.ToLower(out), "identifier rejected") {
		t.Errorf("thief connects with owner's client ID: exit %d %q, want identifier rejected", code, out)
	}
	if _, _ = owner.pub(t, "owner-pub", "evt/owner/state", "after", false); !waitHas(sub, "evt/owner/state", "after", 10*time.Second) {
		t.Errorf("owner's device no longer receives after thief's attempt: %q %s", sub.lines(), sub.stderr.String())
	}
	select {
	case <-sub.done:
		t.Errorf("owner's device was disconnected: %v %s", sub.err, sub.stderr.String())
	default:
	}
	if st := programMQTT(t, p, "thief"); st.Refused[localnats.RefusedClientID] == 0 {
		t.Errorf("program mqtt thief: refused %v, want client_id", st.Refused)
	}
	// The controls.
	if code, out := thief.pub(t, "thief-own", "evt/thief/x", "mine", false); code != 0 {
		t.Errorf("thief with its own client ID: exit %d %s", code, out)
	}
	if code, out := owner.pub(t, "plug-kitchen", "evt/owner/state", "again", false); code != 0 {
		t.Errorf("owner with its own client ID again: exit %d %s", code, out)
	}
}

func waitHas(s *mqttSub, topic, prefix string, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if s.has(topic, prefix) {
			return true
		}
	}
	return false
}
