package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/blobs"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// The MQTT retained state of the mesh, with Debian's mosquitto clients on
// three nodes, each reaching a real RabbitMQ through a proxy of its own.

// retainedNode is a node of the retained-state tests: its arguments (its
// data directory and NATS port stay across restarts) and its proxy to
// the broker.
type retainedNode struct {
	name string
	args []string
	px   *meshtest.Proxy
	p    *meshtest.Process
}

// mqttEnv turns a node's MQTT listener on, on a free port.
var mqttEnv = []string{"MESHBOX_NATS_MQTT=127.0.0.1:0"}

// retainedMesh starts three nodes with MQTT listeners, each through a
// proxy to the broker, and defines on each the programs of a Home
// Assistant set-up: a device side that publishes under homeassistant/,
// and Home Assistant that subscribes there.
func retainedMesh(t *testing.T) map[string]*retainedNode {
	t.Helper()
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	names := []string{"alpha", "beta", "gamma"}
	db := rowsMesh(t, amqpURL, names, nil)
	upstream := hostOf(t, amqpURL)
	nodes := map[string]*retainedNode{}
	for _, n := range names {
		px := meshtest.NewProxy(t, upstream)
		nd := &retainedNode{name: n, px: px, args: []string{"--node", n, "--db", db, "--broker", px.Rewrite(amqpURL, upstream),
			"--data", t.TempDir(), "--nats", fmt.Sprintf("127.0.0.1:%d", meshtest.FreePort(t))}}
		nd.p = meshtest.StartProcessEnv(t, mqttEnv, nd.args...)
		nodes[n] = nd
	}
	for _, n := range names {
		nd := nodes[n]
		meshtest.WaitStatus(t, nd.p.HTTPURL(), 30*time.Second, n+" connected to the broker", func(s appliance.Status) bool { return s.Broker.State == "connected" })
		waitKeysInStep(t, nd.p)
		waitTable(t, nd.p, wire.TableMQTTRetained, 30*time.Second, "reading its log", func(ts rows.TableStatus) bool { return ts.Synced })
		for _, args := range [][]string{
			{"sensor", "--mqtt", "--publish", "homeassistant.>"},
			{"ha", "--mqtt", "--subscribe", "homeassistant.>"},
			{"nosy", "--mqtt", "--publish", "garden.>"},
		} {
			args = append([]string{"program", "add"}, args...)
			args = append(args, "--data", nd.p.DataDir(), "--server", nd.p.NATSURL())
			if code, out, errOut := cli(t, args...); code != 0 || !strings.Contains(out, "the running node applied it") {
				t.Fatalf("program add %s on %s: exit %d: %s%s", args[2], n, code, out, errOut)
			}
		}
	}
	return nodes
}

// retainedNow is what a subscriber to topic that connects now to nd's
// MQTT listener, as program ha, gets at once: "topic payload", or ""
// when nothing comes within 2 s (no retained message).
func retainedNow(t *testing.T, nd *retainedNode, id, topic string) string {
	t.Helper()
	c := mqttOf(t, nd.p, "ha")
	code, out := runMQTT(t, "mosquitto_sub", append(c.args(id), "-q", "1", "-t", topic, "-v", "-C", "1", "-W", "2"), 20*time.Second)
	if code != 0 {
		return ""
	}
	return strings.TrimSpace(out)
}

// waitRetained waits until a later subscriber on nd gets want ("" for
// none) on topic.
func waitRetained(t *testing.T, nd *retainedNode, topic, want string, d time.Duration) {
	t.Helper()
	var got string
	deadline := time.Now().Add(d)
	for i := 0; ; i++ {
		if got = retainedNow(t, nd, fmt.Sprintf("ha-%s-%d", nd.name, i), topic); got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: a later subscriber to %s on %s got %q, want %q\n%s", d, topic, nd.name, got, want, tail(nd.p.Output(), 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func retain(t *testing.T, nd *retainedNode, program, id, topic, msg string) {
	t.Helper()
	c := mqttOf(t, nd.p, program)
	args := append(c.args(id), "-q", "1", "-t", topic, "-r")
	if msg == "" {
		args = append(args, "-n") // a zero-length message: clears the topic
	} else {
		args = append(args, "-m", msg)
	}
	if code, out := runMQTT(t, "mosquitto_pub", args, 15*time.Second); code != 0 {
		t.Fatalf("%s on %s retains %s: exit %d: %s", program, nd.name, topic, code, out)
	}
}

// TestMQTTRetainedAcrossTheMesh: Home Assistant's discovery across the
// mesh. A device's retained discovery message on alpha reaches a later
// subscriber on beta and on gamma, and on beta again after beta restarts
// cut off from the broker; an empty retained message on alpha clears it
// on beta and gamma; alpha and beta retaining the same two topics while
// alpha is cut from the broker each keep their own until the link heals,
// then every node has one value of each, the later retain by the mesh's
// clock: alpha's of one topic, beta's of the other.
func TestMQTTRetainedAcrossTheMesh(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker, a database and three nodes")
	}
	nodes := retainedMesh(t)
	alpha, beta, gamma := nodes["alpha"], nodes["beta"], nodes["gamma"]
	const topic = "evt/homeassistant/sensor/plug1/config"
	const config = `{"name":"plug1","state_topic":"evt/plug1/state"}`

	// Retained on alpha: later subscribers on beta and gamma get it.
	retain(t, alpha, "sensor", "plug1", topic, config)
	waitRetained(t, alpha, topic, topic+" "+config, 10*time.Second)
	waitRetained(t, beta, topic, topic+" "+config, 30*time.Second)
	waitRetained(t, gamma, topic, topic+" "+config, 30*time.Second)

	// beta restarts while cut off from the broker: its own store still
	// holds the mesh's retained state.
	beta.px.Cut(t)
	beta.p.Signal(syscall.SIGTERM)
	if code := beta.p.Wait(); code != 0 {
		t.Fatalf("beta stopped with exit %d", code)
	}
	beta.p = meshtest.StartProcessEnv(t, mqttEnv, beta.args...)
	waitRetained(t, beta, topic, topic+" "+config, 10*time.Second)
	beta.px.Restore(t)
	waitTable(t, beta.p, wire.TableMQTTRetained, 60*time.Second, "reading its log again", func(ts rows.TableStatus) bool { return ts.Synced })

	// An empty retained message on alpha clears it everywhere.
	retain(t, alpha, "sensor", "plug1", topic, "")
	waitRetained(t, alpha, topic, "", 10*time.Second)
	waitRetained(t, beta, topic, "", 30*time.Second)
	waitRetained(t, gamma, topic, "", 30*time.Second)

	// A partition: alpha cut from the broker. On topic state beta
	// retains a value, then alpha another; on topic plug the other way
	// round: each side keeps its own last retain of each.
	const state = "evt/homeassistant/switch/lamp/config"
	const plug = "evt/homeassistant/switch/plug2/config"
	alpha.px.Cut(t)
	waitTable(t, alpha.p, wire.TableMQTTRetained, 30*time.Second, "cut off", func(ts rows.TableStatus) bool { return !ts.Synced })
	retain(t, alpha, "sensor", "plug-a", plug, "from-alpha")
	waitRetained(t, alpha, plug, plug+" from-alpha", 10*time.Second)
	time.Sleep(50 * time.Millisecond) // beta's retains are later by the wall clock, and so by the mesh's
	retain(t, beta, "sensor", "lamp-b", state, "from-beta")
	retain(t, beta, "sensor", "plug-b", plug, "from-beta")
	waitRetained(t, gamma, state, state+" from-beta", 30*time.Second)
	waitRetained(t, gamma, plug, plug+" from-beta", 30*time.Second)
	time.Sleep(50 * time.Millisecond) // alpha's retain is later by the wall clock, and so by the mesh's
	retain(t, alpha, "sensor", "lamp-a", state, "from-alpha")
	waitRetained(t, alpha, state, state+" from-alpha", 10*time.Second)
	waitRetained(t, beta, state, state+" from-beta", 5*time.Second)
	waitRetained(t, alpha, plug, plug+" from-alpha", 5*time.Second)

	// Healed: one winner of each topic everywhere, the later retain
	// (alpha's of state, beta's of plug: the side that was cut off takes
	// the other's too), and the table agrees on every node.
	alpha.px.Restore(t)
	winners := map[string]string{state: "from-alpha", plug: "from-beta"}
	for _, nd := range []*retainedNode{alpha, beta, gamma} {
		for topic, want := range winners {
			waitRetained(t, nd, topic, topic+" "+want, 60*time.Second)
		}
	}
	for _, nd := range []*retainedNode{alpha, beta, gamma} {
		nc := natsConn(t, nd.p)
		for topic, want := range winners {
			var doc rows.RowDoc
			row := strings.ReplaceAll(topic, "/", ".")
			if _, err := rowsCall(nc, wire.TableMQTTRetained, rows.OpGet, rows.Request{Row: row}, &doc, 5*time.Second); err != nil {
				t.Fatalf("%s: get row %s: %v", nd.name, row, err)
			}
			if got := doc.Fields["payload"]; got != want {
				t.Errorf("%s: row %s holds payload %q, want %s (fields %v)", nd.name, row, got, want, doc.Fields)
			}
		}
	}

	// No loop: gamma's devices retained nothing, so gamma wrote nothing
	// to the table, though it put every retained message of the others
	// into its store (a copy heard back was no new write).
	ms := scrape(t, gamma.p.HTTPURL())
	if n, _ := ms.value("meshbox_mqtt_retained_recorded_total"); n != 0 {
		t.Errorf("gamma recorded %v retained publishes, want 0: the mesh's copies in its store came back as writes", n)
	}
	if n, _ := ms.value("meshbox_mqtt_retained_applied_total"); n < 5 {
		t.Errorf("gamma put %v retained messages of the mesh into its store, want at least 5 (set, clear, beta's two, alpha's)", n)
	}
	if n, _ := scrape(t, alpha.p.HTTPURL()).value("meshbox_mqtt_retained_recorded_total"); n != 4 {
		t.Errorf("alpha recorded %v retained publishes, want its devices' 4", n)
	}
}

// TestMQTTRetainedRights: a device whose program may not publish a topic
// cannot make it retained across the mesh, nor can a program with a NATS
// credential write the retained state (through the server's store or the
// table): each beside its control, a device that may.
func TestMQTTRetainedRights(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker, a database and three nodes")
	}
	nodes := retainedMesh(t)
	alpha, beta := nodes["alpha"], nodes["beta"]
	const evil = "evt/homeassistant/lock/front/config"
	const good = "evt/homeassistant/sensor/temp/config"

	// nosy (may publish garden.> only) retains a discovery message.
	// The server drops the publish; the client may or may not say so.
	nosy := mqttOf(t, alpha.p, "nosy")
	_, _ = runMQTT(t, "mosquitto_pub", append(nosy.args("nosy-1"), "-q", "1", "-t", evil, "-r", "-m", `{"name":"unlock me"}`), 15*time.Second)

	// A program with a NATS credential that may write the table and
	// publish the topic's events tries the server's store directly, with
	// a device's name as the source, and the rows API.
	forger := programs.Program{Name: "forger", Publish: []string{"homeassistant.>"}, Write: []string{wire.TableMQTTRetained}}
	creds := meshtest.AddProgram(t, alpha.p.NATSURL(), alpha.p.DataDir(), forger)
	errs := make(chan error, 16)
	fnc := meshtest.ProgramConn(t, alpha.p.NATSURL(), creds, forger, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	m := nats.NewMsg("$MQTT.rmsgs." + strings.ReplaceAll(evil, "/", "."))
	m.Header.Set("Nmqtt-RFlags", "3")
	m.Header.Set("Nmqtt-RSource", "sensor")
	m.Data = []byte(`{"name":"forged"}`)
	if err := fnc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	flush(t, fnc)
	select {
	case err := <-errs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Errorf("forger's publish into the MQTT store: %v, want a permissions violation", err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("forger's publish into the MQTT store was not refused")
	}
	code, err := rowsCall(fnc, wire.TableMQTTRetained, rows.OpPut, rows.Request{Row: strings.ReplaceAll(evil, "/", "."),
		Set: map[string]string{"subject": strings.ReplaceAll(evil, "/", "."), "payload": "forged", "qos": "0", "source": "sensor"}}, nil, 5*time.Second)
	if code != wire.CodeForbidden {
		t.Errorf("forger writes the table through the rows API: code %d (%v), want %d", code, err, wire.CodeForbidden)
	}

	// The control: sensor, which may publish under homeassistant/,
	// retains a message; once beta has it, beta has nothing of nosy's or
	// the forger's.
	retain(t, alpha, "sensor", "sensor-1", good, `{"name":"temp"}`)
	waitRetained(t, beta, good, good+` {"name":"temp"}`, 30*time.Second)
	waitRetained(t, beta, evil, "", 2*time.Second)
	waitRetained(t, alpha, evil, "", 2*time.Second)
}

// TestMQTTRetainedForgedByBlobProgram: a program with the blob store's
// rights only stores a blob chunk carrying the headers of a retained
// message of a device (program sensor), then asks for it by a direct get
// whose reply subject is the server's store of retained messages: the
// server answers there. No other node, and not the table, gets it. The
// control: a device that may publish the topic retains another one, and
// it reaches another node.
func TestMQTTRetainedForgedByBlobProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker, a database and three nodes")
	}
	nodes := retainedMesh(t)
	alpha, beta := nodes["alpha"], nodes["beta"]
	const evil = "evt/homeassistant/sensor/x/config"
	const good = "evt/homeassistant/sensor/temp/config"

	thief := programs.Program{Name: "thief", Blobs: true}
	creds := meshtest.AddProgram(t, alpha.p.NATSURL(), alpha.p.DataDir(), thief)
	tnc := meshtest.ProgramConn(t, alpha.p.NATSURL(), creds, thief)
	if _, err := tnc.Request(blobs.SubjectOpen, nil, 10*time.Second); err != nil {
		t.Fatalf("the thief opens the blob store: %v", err)
	}
	chunk := nats.NewMsg("$O.meshbox-blobs.C.x")
	chunk.Header.Set("Nmqtt-RFlags", "3")
	chunk.Header.Set("Nmqtt-RSource", "sensor")
	chunk.Data = []byte(`{"name":"forged"}`)
	if _, err := tnc.RequestMsg(chunk, 5*time.Second); err != nil {
		t.Fatalf("the thief stores its chunk: %v", err)
	}
	get := nats.NewMsg("$JS.API.DIRECT.GET.OBJ_meshbox-blobs")
	get.Reply = "$MQTT.rmsgs." + strings.ReplaceAll(evil, "/", ".")
	get.Data = []byte(`{"last_by_subj":"$O.meshbox-blobs.C.x"}`)
	if err := tnc.PublishMsg(get); err != nil {
		t.Fatal(err)
	}
	flush(t, tnc)

	// The control: sensor's retain reaches beta; by then beta has nothing
	// of the thief's, and neither has the table.
	retain(t, alpha, "sensor", "sensor-1", good, `{"name":"temp"}`)
	waitRetained(t, beta, good, good+` {"name":"temp"}`, 30*time.Second)
	waitRetained(t, beta, evil, "", 2*time.Second)
	for _, nd := range []*retainedNode{alpha, beta} {
		code, err := rowsCall(natsConn(t, nd.p), wire.TableMQTTRetained, rows.OpGet, rows.Request{Row: strings.ReplaceAll(evil, "/", ".")}, nil, 5*time.Second)
		if code != wire.CodeNotFound {
			t.Errorf("%s: the table's row of %s: code %d (%v), want %d: none", nd.name, evil, code, err, wire.CodeNotFound)
		}
	}
	if n, _ := scrape(t, alpha.p.HTTPURL()).value("meshbox_mqtt_retained_refused_total", "cause=forged"); n < 1 {
		t.Errorf("alpha refused %v forged retained messages, want at least 1 (the attack reached the store's subjects)", n)
	}
}
