package appliance_test

import (
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/programs"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// mqttDevice connects an MQTT client signed in as program p (its password
// from the node's store) to node a, with a persistent session and
// automatic reconnects, as a device does; connects counts its
// connections, and onMsg has every message it receives (once: the
// client's subscriptions have no handlers of their own, which Paho would
// each call for a message their filters match).
func mqttDevice(t *testing.T, a *appliance.Appliance, p programs.Program, id string, connects *atomic.Int32, onMsg mqtt.MessageHandler) mqtt.Client {
	t.Helper()
	store, err := programs.Open(programs.Dir(a.DataDir()))
	if err != nil {
		t.Fatal(err)
	}
	user, password, err := store.MQTTLogin(p.Name)
	if err != nil {
		t.Fatal(err)
	}
	o := mqtt.NewClientOptions().AddBroker("tcp://" + strings.TrimPrefix(a.Status().NATS.MQTT, "mqtt://")).
		SetClientID(id).SetUsername(user).SetPassword(password).SetProtocolVersion(4).
		SetCleanSession(false).SetAutoReconnect(true).SetMaxReconnectInterval(200 * time.Millisecond).
		SetConnectTimeout(5 * time.Second)
	if connects != nil {
		o.SetOnConnectHandler(func(mqtt.Client) { connects.Add(1) })
	}
	if onMsg != nil {
		o.SetDefaultPublishHandler(onMsg)
	}
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("device %s connects: %v", id, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

// TestMQTTRightsNarrowedWhileConnected: a device subscribed at QoS 1 to
// evt/home/# keeps receiving only what its program's rights grant once
// they are narrowed while it is connected: the node disconnects it, it
// reconnects under the new rights, and a publish on evt/home/kitchen
// does not reach it. The control: what the new rights still grant
// (evt/home/hub/...) does, and before the change evt/home/kitchen did.
func TestMQTTRightsNarrowedWhileConnected(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	cfg := meshtest.NodeConfig(t, "mqtt-rights")
	cfg.NATSMQTT = "127.0.0.1:0"
	a := meshtest.StartNode(t, cfg)
	hub := programs.Program{Name: "hub", MQTT: true, Subscribe: []string{"home.>"}}
	meshtest.AddProgram(t, a.NATSURL(), a.DataDir(), hub)
	sensor := programs.Program{Name: "sensor", MQTT: true, Publish: []string{"home.>"}}
	meshtest.AddProgram(t, a.NATSURL(), a.DataDir(), sensor)

	var connects atomic.Int32
	got := make(chan string, 64)
	h := mqttDevice(t, a, hub, "hub-1", &connects, func(_ mqtt.Client, m mqtt.Message) { got <- m.Topic() + "=" + string(m.Payload()) })
	if tok := h.Subscribe("evt/home/#", 1, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("hub subscribes: %v", tok.Error())
	}
	s := mqttDevice(t, a, sensor, "sensor-1", nil, nil)
	publish := func(topic, body string) {
		t.Helper()
		if tok := s.Publish(topic, 1, false, body); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("sensor publishes %s: %v", topic, tok.Error())
		}
	}
	expect := func(want string) {
		t.Helper()
		select {
		case m := <-got:
			if m != want {
				t.Fatalf("hub received %s, want %s only", m, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("hub received nothing in 5s, want %s", want)
		}
	}
	publish("evt/home/kitchen", "k1")
	expect("evt/home/kitchen=k1") // control: granted before the change

	hub.Subscribe = []string{"home.hub.>"}
	meshtest.AddProgram(t, a.NATSURL(), a.DataDir(), hub)
	// The node disconnects hub and it reconnects; a node that kept it
	// connected fails below, on what hub receives.
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end) && !(connects.Load() >= 2 && h.IsConnectionOpen()); {
		time.Sleep(20 * time.Millisecond)
	}
	if tok := h.Subscribe("evt/home/hub/#", 1, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("hub subscribes within its new rights: %v", tok.Error())
	}
	publish("evt/home/kitchen", "k2")
	publish("evt/home/hub/x", "x1")
	expect("evt/home/hub/x=x1") // control: still granted
	select {
	case m := <-got:
		t.Errorf("hub received %s after its rights were narrowed to home.hub.>", m)
	case <-time.After(time.Second):
	}
}

// TestMQTTAnonymousOnlyOnLoopback: a standalone node is open (clients
// without a credential come in), but its MQTT listener off loopback takes
// devices from the network, and a device there signs in as a program: an
// MQTT client without a credential is refused. The controls: a device
// with its program's password comes in there; on the same node a NATS
// client without a credential still does; and an MQTT listener on
// loopback takes a client without one.
func TestMQTTAnonymousOnlyOnLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nodes")
	}
	anon := func(broker string) error {
		o := mqtt.NewClientOptions().AddBroker(broker).SetClientID("anon").SetProtocolVersion(4).
			SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
		c := mqtt.NewClient(o)
		tok := c.Connect()
		if !tok.WaitTimeout(10 * time.Second) {
			return fmt.Errorf("no answer in 10s")
		}
		if tok.Error() == nil {
			c.Disconnect(100)
		}
		return tok.Error()
	}
	brokerOf := func(a *appliance.Appliance) string {
		_, port, _ := net.SplitHostPort(strings.TrimPrefix(a.Status().NATS.MQTT, "mqtt://"))
		return "tcp://127.0.0.1:" + port
	}

	cfg := meshtest.NodeConfig(t, "mqtt-lan")
	cfg.NATSMQTT = "0.0.0.0:0"
	lan := meshtest.StartNode(t, cfg)
	if err := anon(brokerOf(lan)); err == nil {
		t.Error("an MQTT client without a credential came in on a listener off loopback")
	}
	plug := programs.Program{Name: "plug", MQTT: true, Publish: []string{"home.>"}}
	meshtest.AddProgram(t, lan.NATSURL(), lan.DataDir(), plug)
	mqttDevice(t, lan, plug, "plug-1", nil, nil) // control: fails the test if refused
	nc, err := nats.Connect(lan.NATSURL(), nats.MaxReconnects(0))
	if err != nil {
		t.Errorf("control: a NATS client without a credential on the open node: %v", err)
	} else {
		nc.Close()
	}

	cfg = meshtest.NodeConfig(t, "mqtt-local")
	cfg.NATSMQTT = "127.0.0.1:0"
	local := meshtest.StartNode(t, cfg)
	if err := anon(brokerOf(local)); err != nil {
		t.Errorf("control: an MQTT client without a credential on a loopback listener of an open node: %v", err)
	}
}
