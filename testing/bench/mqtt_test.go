package bench

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// BenchmarkMQTTLocal measures an MQTT device's message to another device
// on the same node: a QoS 0 publish on the node's MQTT listener until a
// QoS 0 subscriber there has it, both with the Eclipse Paho client,
// signed in as a program with the rights to the topic. The baseline is
// the same round through a plain nats-server's MQTT listener (in this
// process, JetStream on, no authentication): what meshbox's listener,
// permissions and bridge cost on top. It prints
//
//	BENCH mqtt-local ours=<µs> baseline=<µs> ratio=<ours/baseline> p99=<µs> baseline_p99=<µs>
//
// p50 of benchRoundTrips rounds, interleaved with the baseline's after
// benchWarmUp of each. Target ratio <= 1.1.
//
// A node's bridge subscribes to every event (evt.>) to send it into the
// mesh and to answer a program that asks for a confirmation, so the
// server hands each device's message to a second subscriber. The floor
// is the plain server with that second subscriber and nothing else: an
// in-process nats.go connection subscribed to evt.> whose handler
// returns at once, as the bridge's does on a node without a broker. It
// is run in the same interleaving and printed as
//
//	BENCH mqtt-local-vs-floor ours=<µs> baseline=<floor µs> ratio=<ours/floor>
//	BENCH mqtt-local-floor ours=<floor µs> baseline=<µs> ratio=<floor/plain>
//
// so that a run says how much of the ratio is that subscriber and how
// much the rest of the node.
//
// The node above is standalone. The same devices on a node of a mesh
// (a broker and a mesh database of the benchmark's own, and a second
// node, the ear), whose other nodes do not listen to the devices' topic,
// are
//
//	BENCH mqtt-local-mesh ours=<µs> baseline=<µs> ratio=<ours/plain> broker_cpu_per_event=<µs> unsubscribed_bytes_per_event=<B>
//
// The node sends such events to nobody: the broker's CPU per event is
// next to none. The broker runs on the benchmark's machine, as a home
// node's does not: broker_cpu_per_event is the CPU it spends on each
// event of the round (taking it, confirming it, delivering it), time the
// round competes with for the cores. unsubscribed_bytes_per_event is what
// the broker sent the node (through a counting proxy) for events it does
// not listen to from the mesh, its own included: none, as the node binds
// only other nodes' lanes for the topics its programs listen to.
//
// A second pair of devices on the same node, whose topic the ear
// listens to, so that the bridge seals every event and publishes it to
// the broker with a confirm, and the broker delivers it to the ear on
// the same machine, is
//
//	BENCH mqtt-local-mesh-heard ours=<µs> baseline=<µs> ratio=<ours/plain> broker_cpu_per_event=<µs>
func BenchmarkMQTTLocal(b *testing.B) {
	cfg := meshtest.NodeConfig(b, "mqtt-bench")
	cfg.Log.Level = "info"
	cfg.NATSMQTT = "127.0.0.1:0"
	ours := mqttDevices(b, meshtest.StartNode(b, cfg))
	m := newBenchBroker(b, "mqtt-mesh", "mqtt-ear")
	bu, err := url.Parse(m.users["mqtt-mesh"])
	if err != nil {
		b.Fatal(err)
	}
	px := meshtest.NewCountingProxy(b, bu.Host)
	meshNode := startBenchNode(b, "mqtt-mesh", px.Rewrite(m.users["mqtt-mesh"], bu.Host), m.dbURL,
		func(c *appliance.Config) { c.NATSMQTT = "127.0.0.1:0" })
	ear := startBenchNode(b, "mqtt-ear", m.users["mqtt-ear"], m.dbURL)
	mesh := mqttDevices(b, meshNode)
	heard := mqttDevices(b, meshNode)
	heardTopic := fmt.Sprintf("evt.bench.rt%d", mqttRuns) // the last pair's
	enc := benchConn(b, ear.NATSURL(), meshtest.AdminOption(b, ear.DataDir()))
	if _, err := enc.Subscribe(heardTopic, func(*nats.Msg) {}); err != nil {
		b.Fatal(err)
	}
	meshtest.WaitFor(b, 30*time.Second, "the mesh node knows that the ear listens to "+heardTopic+", and no more", func() bool {
		l := meshNode.Status().Broker.EventBindings.Listeners
		return l != nil && !l.All && slices.Equal(l.Topics, []string{heardTopic[len("evt."):]})
	})
	plainAddr, _ := plainMQTTServer(b)
	plain := mqttRoundTrip(b, "tcp://"+plainAddr, "", "")
	floorAddr, floorSrv := plainMQTTServer(b)
	forwarder(b, floorSrv)
	floor := mqttRoundTrip(b, "tcp://"+floorAddr, "", "")
	for range b.N {
		bcpu0, fr0 := m.rmq.CPUTime(b), px.Frames()
		t := interleavedQuantiles(b, ours, plain, floor, mesh)
		// Only the mesh node's devices may reach the broker: one event a
		// round, warm-up included.
		bcpu := (m.rmq.CPUTime(b) - bcpu0) / (benchWarmUp + benchRoundTrips)
		hcpu0 := m.rmq.CPUTime(b)
		th := interleavedQuantiles(b, heard, plain)
		hcpu := (m.rmq.CPUTime(b) - hcpu0) / (benchWarmUp + benchRoundTrips)
		var back int64
		for k, v := range px.Frames().Sub(fr0) {
			if k.Dir == "down" && k.Method == "basic.deliver" && strings.HasPrefix(k.Key, "evt.") {
				back += v.Bytes
			}
		}
		report("mqtt-local", us(t[0].p50), us(t[1].p50), "µs",
			"QoS 0 publish to a subscriber on the same node, Paho clients; baseline: a plain nats-server's MQTT listener; lower is better; target ratio <= 1.1",
			fmt.Sprintf("p99=%.1f", us(t[0].p99)), fmt.Sprintf("baseline_p99=%.1f", us(t[1].p99)))
		report("mqtt-local-vs-floor", us(t[0].p50), us(t[2].p50), "µs",
			"the same against the floor: the plain server with one more in-process subscriber on evt.>, as the bridge is; lower is better",
			fmt.Sprintf("p99=%.1f", us(t[0].p99)), fmt.Sprintf("baseline_p99=%.1f", us(t[2].p99)))
		report("mqtt-local-floor", us(t[2].p50), us(t[1].p50), "µs",
			"what the second subscriber alone costs the plain server's round; lower is better",
			fmt.Sprintf("p99=%.1f", us(t[2].p99)), fmt.Sprintf("baseline_p99=%.1f", us(t[1].p99)))
		report("mqtt-local-mesh-heard", us(th[0].p50), us(th[1].p50), "µs",
			"the same on a node of a mesh whose other node listens to the topic: the bridge seals each event and sends it to the broker, which delivers it to that node, all on the same two cores; lower is better",
			fmt.Sprintf("p99=%.1f", us(th[0].p99)), fmt.Sprintf("baseline_p99=%.1f", us(th[1].p99)),
			fmt.Sprintf("broker_cpu_per_event=%.1fµs", us(hcpu)))
		report("mqtt-local-mesh", us(t[3].p50), us(t[1].p50), "µs",
			"the same round on a node of a mesh whose other nodes do not listen to the topic: the node sends the events to nobody; lower is better; target ratio <= 1.3",
			fmt.Sprintf("p99=%.1f", us(t[3].p99)), fmt.Sprintf("baseline_p99=%.1f", us(t[1].p99)),
			fmt.Sprintf("broker_cpu_per_event=%.1fµs", us(bcpu)),
			fmt.Sprintf("unsubscribed_bytes_per_event=%.1f", float64(back)/float64(benchWarmUp+benchRoundTrips)))
	}
}

// forwarder subscribes an in-process nats.go connection to srv's evt.>
// with a handler that returns at once: the second subscriber a node's
// bridge is, without the bridge. It is closed when b ends.
func forwarder(b *testing.B, srv *server.Server) {
	b.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(srv), nats.Name("forwarder"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	sub, err := nc.Subscribe("evt.>", func(m *nats.Msg) {
		if m.Reply != "" {
			_ = m.Respond(nil)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	_ = sub.SetPendingLimits(1<<20, 256<<20)
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
}

// mqttDevices adds a program with MQTT rights to bench.> on node and
// returns the round trip of two devices signed in as it there.
func mqttDevices(b *testing.B, node *appliance.Appliance) func() error {
	b.Helper()
	dev := programs.Program{Name: "dev", MQTT: true, Publish: []string{"bench.>"}, Subscribe: []string{"bench.>"}}
	meshtest.AddProgram(b, node.NATSURL(), node.DataDir(), dev)
	store, err := programs.Open(programs.Dir(node.DataDir()))
	if err != nil {
		b.Fatal(err)
	}
	user, password, err := store.MQTTLogin(dev.Name)
	if err != nil {
		b.Fatal(err)
	}
	return mqttRoundTrip(b, "tcp://"+strings.TrimPrefix(node.Status().NATS.MQTT, "mqtt://"), user, password)
}

// plainMQTTServer starts a nats-server with an MQTT listener (and the
// JetStream it needs) in this process and returns the listener's
// host:port and the server; it is shut down when b ends.
func plainMQTTServer(b *testing.B) (string, *server.Server) {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	srv, err := server.NewServer(&server.Options{
		ServerName: "plain-mqtt", Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true,
		JetStream: true, StoreDir: b.TempDir(), DisableJetStreamBanner: true,
		MQTT: server.MQTTOpts{Host: "127.0.0.1", Port: port},
	})
	if err != nil {
		b.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		b.Fatal("plain nats-server not ready in 10s")
	}
	b.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return "127.0.0.1:" + strconv.Itoa(port), srv
}

// mqttRoundTrip returns one QoS 0 message from a publishing client to a
// subscribing one on broker (tcp://host:port), both signed in as user
// (none when empty).
func mqttRoundTrip(b *testing.B, broker, user, password string) func() error {
	b.Helper()
	mqttRuns++
	topic := fmt.Sprintf("evt/bench/rt%d", mqttRuns)
	got := make(chan string, 16)
	connect := func(id string) mqtt.Client {
		o := mqtt.NewClientOptions().AddBroker(broker).SetClientID(fmt.Sprintf("%s-%d", id, mqttRuns)).
			SetProtocolVersion(4).SetCleanSession(true).SetAutoReconnect(false).SetConnectTimeout(10 * time.Second)
		if user != "" {
			o.SetUsername(user).SetPassword(password)
		}
		c := mqtt.NewClient(o)
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			b.Fatalf("MQTT %s connects to %s: %v", id, broker, tok.Error())
		}
		b.Cleanup(func() { c.Disconnect(100) })
		return c
	}
	sub, pub := connect("sub"), connect("pub")
	if tok := sub.Subscribe(topic, 0, func(_ mqtt.Client, m mqtt.Message) { got <- string(m.Payload()) }); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		b.Fatalf("MQTT subscribe on %s: %v", broker, tok.Error())
	}
	n := 0
	return func() error {
		n++
		body := strconv.Itoa(n)
		if tok := pub.Publish(topic, 0, false, body); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			return fmt.Errorf("publish on %s: %v", broker, tok.Error())
		}
		timeout := time.After(5 * time.Second)
		for {
			select {
			case s := <-got:
				if s == body {
					return nil
				}
			case <-timeout:
				return fmt.Errorf("no message %s on %s within 5s", body, broker)
			}
		}
	}
}

// mqttRuns numbers the round trips' clients and topics.
var mqttRuns int
