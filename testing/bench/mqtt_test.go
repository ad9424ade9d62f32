package bench

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats-server/v2/server"

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
func BenchmarkMQTTLocal(b *testing.B) {
	cfg := meshtest.NodeConfig(b, "mqtt-bench")
	cfg.Log.Level = "info"
	cfg.NATSMQTT = "127.0.0.1:0"
	node := meshtest.StartNode(b, cfg)
	dev := programs.Program{Name: "dev", MQTT: true, Publish: []string{"bench.>"}, Subscribe: []string{"bench.>"}}
	meshtest.AddProgram(b, node.NATSURL(), node.DataDir(), dev)
	store, err := programs.Open(programs.Dir(node.DataDir()))
	if err != nil {
		b.Fatal(err)
	}
	data, err := os.ReadFile(store.MQTTPath(dev.Name))
	if err != nil {
		b.Fatal(err)
	}
	user, password, err := programs.ReadMQTT(data)
	if err != nil {
		b.Fatal(err)
	}
	ours := mqttRoundTrip(b, "tcp://"+strings.TrimPrefix(node.Status().NATS.MQTT, "mqtt://"), user, password)
	plain := mqttRoundTrip(b, "tcp://"+plainMQTTServer(b), "", "")
	for range b.N {
		t := interleavedQuantiles(b, ours, plain)
		report("mqtt-local", us(t[0].p50), us(t[1].p50), "µs",
			"QoS 0 publish to a subscriber on the same node, Paho clients; baseline: a plain nats-server's MQTT listener; lower is better; target ratio <= 1.1",
			fmt.Sprintf("p99=%.1f", us(t[0].p99)), fmt.Sprintf("baseline_p99=%.1f", us(t[1].p99)))
	}
}

// plainMQTTServer starts a nats-server with an MQTT listener (and the
// JetStream it needs) in this process and returns the listener's
// host:port; it is shut down when b ends.
func plainMQTTServer(b *testing.B) string {
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
	return "127.0.0.1:" + strconv.Itoa(port)
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
