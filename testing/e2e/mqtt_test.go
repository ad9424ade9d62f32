package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// mqttClient runs Debian's mosquitto_pub or mosquitto_sub (the real MQTT
// clients a home server has) against an MQTT listener.
type mqttClient struct {
	host, port, user, password string
}

// mqttOf is the MQTT listener of p, signed in as program name (its MQTT
// password file from the node's store).
func mqttOf(t *testing.T, p *meshtest.Process, name string) mqttClient {
	t.Helper()
	st := meshtest.Status(t, p.HTTPURL())
	addr, ok := strings.CutPrefix(st.NATS.MQTT, "mqtt://")
	if !ok {
		t.Fatalf("%s's status: nats.mqtt %q, want mqtt://host:port", p.Node(), st.NATS.MQTT)
	}
	c := mqttClient{host: addr[:strings.LastIndex(addr, ":")], port: addr[strings.LastIndex(addr, ":")+1:]}
	if name == "" {
		return c
	}
	store, err := programs.Open(programs.Dir(p.DataDir()))
	if err != nil {
		t.Fatal(err)
	}
	if c.user, c.password, err = store.MQTTLogin(name); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c mqttClient) args(id string) []string {
	a := []string{"-h", c.host, "-p", c.port, "-i", id, "-V", "mqttv311"}
	if c.user != "" {
		a = append(a, "-u", c.user, "-P", c.password)
	}
	return a
}

// pub publishes one message with QoS 1 (retained if asked) and returns
// the client's exit code and output.
func (c mqttClient) pub(t *testing.T, id, topic, msg string, retain bool) (int, string) {
	t.Helper()
	args := append(c.args(id), "-q", "1", "-t", topic, "-m", msg)
	if retain {
		args = append(args, "-r")
	}
	return runMQTT(t, "mosquitto_pub", args, 15*time.Second)
}

// sub subscribes to topics with QoS 1 in the background and collects
// what arrives (one "topic payload" line each) until the test ends.
func (c mqttClient) sub(t *testing.T, id string, topics ...string) *mqttSub {
	t.Helper()
	return c.subWith(t, id, nil, topics...)
}

// subWith is sub with more arguments of mosquitto_sub (a will, say).
func (c mqttClient) subWith(t *testing.T, id string, extra []string, topics ...string) *mqttSub {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &mqttSub{done: make(chan struct{})}
	args := append(append(c.args(id), "-q", "1", "-v"), extra...)
	for _, topic := range topics {
		args = append(args, "-t", topic)
	}
	// Line-buffered: to a pipe, mosquitto_sub's output waits for a full
	// buffer otherwise.
	cmd := exec.CommandContext(ctx, "stdbuf", append([]string{"-oL", "mosquitto_sub"}, args...)...)
	cmd.Stdout, cmd.Stderr = s, &s.stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("mosquitto_sub: %v (run `make services`, testing/services.sh)", err)
	}
	go func() { // exits with the client
		s.err = cmd.Wait()
		close(s.done)
	}()
	s.stop = func() {
		cancel()
		<-s.done
	}
	t.Cleanup(s.stop)
	return s
}

// runMQTT runs an MQTT client to its end (at most limit).
func runMQTT(t *testing.T, bin string, args []string, limit time.Duration) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		}
		t.Fatalf("%s: %v (run `make services`, testing/services.sh)", bin, err)
	}
	return 0, string(out)
}

// mqttSub is a running mosquitto_sub: the lines it printed.
type mqttSub struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	stderr bytes.Buffer
	done   chan struct{}
	err    error
	// stop kills the client, as a crash or a power cut would (the
	// server sends its will), and waits for its end; again, nothing.
	stop func()
}

func (s *mqttSub) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *mqttSub) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Split(strings.ReplaceAll(s.buf.String(), " ", "|"), "\n")
}

// has reports whether the subscriber got a message on topic with a
// payload that starts with prefix.
func (s *mqttSub) has(topic, prefix string) bool {
	for _, l := range s.lines() {
		if strings.HasPrefix(l, topic+"|"+prefix) {
			return true
		}
	}
	return false
}

// TestMQTTDevicesAcrossTheMesh: a device on node alpha (mosquitto_pub,
// with its program's MQTT password) publishes an event; a NATS program on
// node beta and an MQTT subscriber on node gamma (mosquitto_sub) receive
// it; a retained message reaches a subscriber that comes later. Refusals,
// each beside its control: a device that may not publish the topic, one
// that may not subscribe to it, a wrong password, and a device's password
// on the NATS port.
func TestMQTTDevicesAcrossTheMesh(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker, a database and three nodes")
	}
	meshtest.Binary(t)
	vhost := meshtest.RabbitMQ(t).Vhost(t)
	db := meshtest.Postgres(t).Database(t)
	if code, _, errOut := cli(t, "init", "--db", db, "--node", "alpha", "--broker", meshtest.NoCredential(vhost)); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	mesh(t, db, "node", "add", "beta", "--record-only")
	mesh(t, db, "node", "add", "gamma", "--record-only")
	withMQTT := []string{"MESHBOX_NATS_MQTT=127.0.0.1:0"}
	alpha := meshtest.StartProcessEnv(t, withMQTT, "--node", "alpha", "--db", db)
	beta := meshtest.StartProcess(t, "--node", "beta", "--db", db)
	gamma := meshtest.StartProcessEnv(t, withMQTT, "--node", "gamma", "--db", db)
	for _, p := range []*meshtest.Process{alpha, beta, gamma} {
		meshtest.WaitStatus(t, p.HTTPURL(), 20*time.Second, p.Node()+" connected to the broker", func(s appliance.Status) bool { return s.Broker.State == "connected" })
		waitKeysInStep(t, p)
	}
	if st := meshtest.Status(t, beta.HTTPURL()); st.NATS.MQTT != "" {
		t.Errorf("beta has no MQTT listener configured, but its status says %q", st.NATS.MQTT)
	}

	// The devices' programs, defined as a user would.
	for _, d := range []struct {
		node *meshtest.Process
		args []string
	}{
		{alpha, []string{"plug1", "--mqtt", "--publish", "home.>"}},
		{alpha, []string{"nosy", "--mqtt", "--publish", "garden.>", "--subscribe", "garden.>"}},
		{alpha, []string{"hub", "--mqtt", "--subscribe", "home.>"}},
		{gamma, []string{"panel", "--mqtt", "--subscribe", "home.>"}},
	} {
		args := append([]string{"program", "add"}, d.args...)
		args = append(args, "--data", d.node.DataDir(), "--server", d.node.NATSURL())
		code, out, errOut := cli(t, args...)
		if code != 0 || !strings.Contains(out, "MQTT: user "+d.args[0]+" password ") || !strings.Contains(out, "the running node applied it") {
			t.Fatalf("program add %s: exit %d: %s%s", d.args[0], code, out, errOut)
		}
	}
	plug, nosy, hub, panel := mqttOf(t, alpha, "plug1"), mqttOf(t, alpha, "nosy"), mqttOf(t, alpha, "hub"), mqttOf(t, gamma, "panel")

	// A NATS program on beta, an MQTT subscriber on gamma.
	got := make(chan string, 256)
	bnc := natsConn(t, beta)
	if _, err := bnc.Subscribe(wire.EventSubject("home.>"), func(m *nats.Msg) { got <- m.Subject + " " + string(m.Data) }); err != nil {
		t.Fatal(err)
	}
	flush(t, bnc)
	onGamma := panel.sub(t, "panel-1", "evt/home/#")
	gnc := natsConn(t, gamma)
	gotGamma := make(chan string, 1024)
	if _, err := gnc.Subscribe(wire.EventSubject("home.>"), func(m *nats.Msg) { gotGamma <- m.Subject }); err != nil {
		t.Fatal(err)
	}
	flush(t, gnc)

	// The device publishes until both have it: the nodes bind the topic
	// from the broker once they see their subscribers.
	var fromBeta string
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; fromBeta == "" || !onGamma.has("evt/home/kitchen/temp", "21.5"); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("after 60s: beta got %q, gamma's NATS program %d, gamma's mosquitto_sub printed %q (%s)", fromBeta, len(gotGamma), onGamma.lines(), onGamma.stderr.String())
		}
		if code, out := plug.pub(t, fmt.Sprintf("plug1-%d", i), "evt/home/kitchen/temp", fmt.Sprintf("21.5 #%d", i), false); code != 0 {
			t.Fatalf("plug1 publishes: exit %d: %s", code, out)
		}
		select {
		case m := <-got:
			if strings.HasPrefix(m, "evt.home.kitchen.temp 21.5 #") {
				fromBeta = m
			}
		case <-time.After(300 * time.Millisecond):
		}
	}

	// Retained: a subscriber that comes later gets the last state.
	if code, out := plug.pub(t, "plug1-state", "evt/home/plug1/state", "ON", true); code != 0 {
		t.Fatalf("plug1 publishes its retained state: exit %d: %s", code, out)
	}
	later := hub.sub(t, "hub-1", "evt/home/plug1/#")
	meshtest.WaitFor(t, 10*time.Second, "a later subscriber on alpha has plug1's retained state", func() bool { return later.has("evt/home/plug1/state", "ON") })

	// Refused: publishing a topic outside its rights (beta never sees it,
	// while plug1's next message, the control, arrives).
	_, _ = nosy.pub(t, "nosy-pub", "evt/home/kitchen/temp", "from nosy", false)
	if code, out := plug.pub(t, "plug1-after", "evt/home/kitchen/temp", "21.5 after nosy", false); code != 0 {
		t.Fatalf("plug1 publishes after nosy: exit %d: %s", code, out)
	}
	for seen := false; !seen; {
		select {
		case m := <-got:
			if strings.Contains(m, "from nosy") {
				t.Errorf("beta got nosy's message on a topic nosy may not publish: %s", m)
			}
			seen = strings.Contains(m, "21.5 after nosy")
		case <-time.After(20 * time.Second):
			t.Fatal("beta did not get plug1's message after nosy's")
		}
	}
	// Refused: subscribing outside its rights.
	code, out := runMQTT(t, "mosquitto_sub", append(nosy.args("nosy-sub"), "-q", "1", "-t", "evt/home/#", "-C", "1", "-W", "5"), 20*time.Second)
	if !strings.Contains(strings.ToLower(out), "subscription requests were denied") {
		t.Errorf("nosy subscribes to evt/home/#: exit %d %q, want the subscription denied", code, out)
	}
	// Its control: the same client on its own topics.
	code, out = runMQTT(t, "mosquitto_sub", append(nosy.args("nosy-sub"), "-q", "1", "-t", "evt/garden/#", "-C", "1", "-W", "2"), 20*time.Second)
	if strings.Contains(strings.ToLower(out), "denied") {
		t.Errorf("nosy subscribes to evt/garden/#: exit %d %q, want it allowed", code, out)
	}
	// Refused: a wrong password.
	wrong := plug
	wrong.password = "not-" + plug.password
	if code, out := wrong.pub(t, "plug1-wrong", "evt/home/kitchen/temp", "x", false); code == 0 || !strings.Contains(strings.ToLower(out), "not authori") {
		t.Errorf("plug1 with a wrong password: exit %d %q, want the connection refused as not authorised", code, out)
	}
	// Refused: a device's password opens the MQTT listener only.
	if nc, err := nats.Connect(alpha.NATSURL(), nats.UserInfo(plug.user, plug.password), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Errorf("plug1's MQTT password signed in on alpha's NATS port")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("plug1's MQTT password on the NATS port: %v, want an authorization violation", err)
	}
	// Without a credential: a node in a mesh takes no anonymous device.
	anon := mqttOf(t, alpha, "")
	if code, out := anon.pub(t, "anonymous", "evt/home/kitchen/temp", "x", false); code == 0 {
		t.Errorf("an MQTT client without a credential published on alpha: %q", out)
	}
}
