package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/rows"
	"github.com/meshbox/meshbox/internal/wire"
	"github.com/meshbox/meshbox/testing/meshtest"
)

// docs/mqtt.md's worked example, Zigbee2MQTT on node attic and Home
// Assistant on node den, with mosquitto clients in the two programs'
// places.

// z2mSettings are the Zigbee2MQTT settings of the page's example.
type z2mSettings struct {
	baseTopic, clientID, discoveryTopic, statusTopic string
}

// exampleZ2MSettings reads the Zigbee2MQTT settings block of
// docs/mqtt.md (after its <!-- test: zigbee2mqtt settings --> comment),
// and checks that the page tells Home Assistant the same topics.
func exampleZ2MSettings(t *testing.T) z2mSettings {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "mqtt.md"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(raw)
	_, block, ok := strings.Cut(page, "<!-- test: zigbee2mqtt settings -->\n```yaml\n")
	if !ok {
		t.Fatal("docs/mqtt.md: no yaml block after <!-- test: zigbee2mqtt settings -->")
	}
	block, _, _ = strings.Cut(block, "```")
	get := func(key string) string {
		m := regexp.MustCompile(`(?m)^\s+` + key + `:\s*(\S+)`).FindStringSubmatch(block)
		if m == nil {
			t.Fatalf("docs/mqtt.md: the Zigbee2MQTT settings have no %s", key)
		}
		return m[1]
	}
	s := z2mSettings{baseTopic: get("base_topic"), clientID: get("client_id"), discoveryTopic: get("discovery_topic"), statusTopic: get("status_topic")}
	for _, want := range []string{
		"**Discovery prefix**:\n  `" + s.discoveryTopic + "`",
		"**Birth message**: topic\n  `" + s.statusTopic + "`",
		"**Will\n  message**: topic `" + s.statusTopic + "`",
		"**Client ID**: `homeassistant`",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("docs/mqtt.md: Home Assistant's settings do not say %q", want)
		}
	}
	return s
}

// runPagePrograms runs the program commands of docs/mqtt.md's shell
// blocks marked "on NODE" on those nodes, as written.
func runPagePrograms(t *testing.T, nodes map[string]*meshtest.Process) {
	t.Helper()
	ran := 0
	for _, b := range pageBlocks(t, "mqtt.md") {
		if strings.HasPrefix(b.how, "skip") {
			continue
		}
		p := nodes[strings.TrimPrefix(b.how, "on ")]
		if p == nil || !strings.HasPrefix(b.how, "on ") {
			t.Fatalf("docs/mqtt.md: a block %q, on no node of the example", b.how)
		}
		for _, line := range b.lines {
			line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "sudo "))
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if !strings.HasPrefix(line, "meshbox program add ") {
				t.Fatalf("docs/mqtt.md, %s: %q is no program add", b.how, line)
			}
			args := shellWords(t, strings.ReplaceAll(line, "/var/lib/meshbox", p.DataDir()))[1:]
			code, out, errOut := cliEnv(t, onNode(p), args...)
			if code != 0 || !strings.Contains(out, "the running node applied it") {
				t.Fatalf("docs/mqtt.md, %s: %s\nexit %d\nstdout: %s\nstderr: %s", b.how, line, code, out, errOut)
			}
			ran++
		}
	}
	if ran != 2 {
		t.Fatalf("docs/mqtt.md: ran %d program commands, want the example's 2", ran)
	}
}

// retainedSet waits until a subscriber of program c to topics, connecting
// now, gets a retained message on each topic of want (topic → payload
// prefix) at once.
func retainedSet(t *testing.T, c mqttClient, node string, want map[string]string, topics ...string) {
	t.Helper()
	var out string
	ok := meshtest.Poll(30*time.Second, func() bool {
		args := append(c.args(fmt.Sprintf("probe-%d", time.Now().UnixNano())), "-q", "1", "-v", "-C", fmt.Sprint(len(want)), "-W", "2")
		for _, topic := range topics {
			args = append(args, "-t", topic)
		}
		_, out = runMQTT(t, "mosquitto_sub", args, 20*time.Second)
		for topic, prefix := range want {
			if !strings.Contains(out, topic+" "+prefix) {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("a subscriber connecting on %s did not get %v; the last got:\n%s", node, want, out)
	}
}

// TestMQTTZigbee2MQTTHomeAssistant runs the worked example of
// docs/mqtt.md: its program commands as written on attic and den, and
// the flow with mosquitto clients in Zigbee2MQTT's place (on attic, with
// the page's topics) and Home Assistant's (on den). Zigbee2MQTT retains
// two discovery messages, a device's state and availability and its
// bridge's state; Home Assistant connects later and gets them all at
// once; its birth message and a command reach Zigbee2MQTT, whose new
// retained state reaches Home Assistant; Home Assistant is killed (its
// will reaches Zigbee2MQTT) and reconnects with its client ID: it gets
// every discovery message again, and the device's latest state only.
func TestMQTTZigbee2MQTTHomeAssistant(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker, a database and two nodes")
	}
	z2m := exampleZ2MSettings(t)
	amqpURL := meshtest.RabbitMQ(t).Vhost(t)
	db := rowsMesh(t, amqpURL, []string{"attic", "den"}, nil)
	nodes := map[string]*meshtest.Process{}
	for _, n := range []string{"attic", "den"} {
		nodes[n] = meshtest.StartProcessEnv(t, mqttEnv, "--node", n, "--db", db)
	}
	for n, p := range nodes {
		meshtest.WaitStatus(t, p.HTTPURL(), 30*time.Second, n+" connected to the broker", func(s appliance.Status) bool { return s.Broker.State == "connected" })
		waitKeysInStep(t, p)
		waitTable(t, p, wire.TableMQTTRetained, 30*time.Second, "reading its log", func(ts rows.TableStatus) bool { return ts.Synced })
	}
	runPagePrograms(t, nodes)
	attic, den := nodes["attic"], nodes["den"]
	zc, hc := mqttOf(t, attic, "zigbee2mqtt"), mqttOf(t, den, "homeassistant")

	// Zigbee2MQTT: subscribed to its base topic and Home Assistant's
	// status, it publishes its retained messages.
	base, disc := z2m.baseTopic, z2m.discoveryTopic
	const ieee = "0x00158d0001a2b3c4"
	lamp := base + "/lamp"
	lightCfg := disc + "/light/" + ieee + "/light/config"
	lqiCfg := disc + "/sensor/" + ieee + "/linkquality/config"
	avail := []string{`{"topic":"` + base + `/bridge/state","value_template":"{{value_json.state}}"}`, `{"topic":"` + lamp + `/availability","value_template":"{{value_json.state}}"}`}
	retained := []struct{ topic, msg string }{
		{base + "/bridge/state", `{"state":"online"}`},
		{lightCfg, `{"name":null,"unique_id":"` + ieee + `_light_zigbee2mqtt","schema":"json","state_topic":"` + lamp + `","command_topic":"` + lamp + `/set","brightness":true,"availability":[` + strings.Join(avail, ",") + `],"availability_mode":"all"}`},
		{lqiCfg, `{"name":"Linkquality","unique_id":"` + ieee + `_linkquality_zigbee2mqtt","state_topic":"` + lamp + `","value_template":"{{value_json.linkquality}}","availability":[` + strings.Join(avail, ",") + `]}`},
		{lamp, `{"state":"OFF","brightness":0,"linkquality":120}`},
		{lamp + "/availability", `{"state":"online"}`},
	}
	zsub := zc.sub(t, z2m.clientID, base+"/#", z2m.statusTopic)
	for i, r := range retained {
		if code, out := zc.pub(t, fmt.Sprintf("%s-pub-%d", z2m.clientID, i), r.topic, r.msg, true); code != 0 {
			t.Fatalf("zigbee2mqtt retains %s: exit %d: %s", r.topic, code, out)
		}
	}
	all := map[string]string{}
	for _, r := range retained {
		all[r.topic] = r.msg
	}

	// Home Assistant connects later, on den: once the mesh carried the
	// retained messages there, it gets every one of them at once.
	start := time.Now()
	retainedSet(t, hc, "den", all, disc+"/#", base+"/#")
	t.Logf("the retained messages of attic reached den's store in %v", time.Since(start).Round(time.Millisecond))
	will := []string{"--will-topic", z2m.statusTopic, "--will-payload", "offline"}
	ha := hc.subWith(t, "homeassistant", will, disc+"/#", base+"/#")
	for _, r := range retained {
		if !waitHas(ha, r.topic, r.msg, 10*time.Second) {
			t.Fatalf("Home Assistant on den did not get %s %s at its subscription; it got %q (%s)", r.topic, r.msg, ha.lines(), ha.stderr.String())
		}
	}

	// Its birth message and a command reach Zigbee2MQTT on attic (sent
	// again until they do: attic learns of den's interest meanwhile).
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; !zsub.has(z2m.statusTopic, "online") || !zsub.has(lamp+"/set", `{"state":"ON"`); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("after 30s Zigbee2MQTT on attic got %q (%s)", zsub.lines(), zsub.stderr.String())
		}
		if code, out := hc.pub(t, fmt.Sprintf("homeassistant-birth-%d", i), z2m.statusTopic, "online", false); code != 0 {
			t.Fatalf("Home Assistant's birth message: exit %d: %s", code, out)
		}
		if code, out := hc.pub(t, fmt.Sprintf("homeassistant-cmd-%d", i), lamp+"/set", `{"state":"ON","brightness":254}`, false); code != 0 {
			t.Fatalf("Home Assistant's command: exit %d: %s", code, out)
		}
		waitHas(zsub, lamp+"/set", `{"state":"ON"`, 500*time.Millisecond)
	}

	// Zigbee2MQTT retains the lamp's new state: Home Assistant has it at
	// once, and so has a later subscriber on den.
	const on = `{"state":"ON","brightness":254,"linkquality":120}`
	if code, out := zc.pub(t, z2m.clientID+"-state", lamp, on, true); code != 0 {
		t.Fatalf("zigbee2mqtt retains the lamp's new state: exit %d: %s", code, out)
	}
	if !waitHas(ha, lamp, on, 20*time.Second) {
		t.Fatalf("Home Assistant did not get the lamp's new state; it got %q", ha.lines())
	}
	retainedSet(t, hc, "den", map[string]string{lamp: on}, lamp)

	// Home Assistant restarts: killed, its will reaches Zigbee2MQTT; it
	// connects again with its client ID and gets every discovery message,
	// and the lamp's latest state, not the one it replaced.
	ha.stop()
	if !waitHas(zsub, z2m.statusTopic, "offline", 20*time.Second) {
		t.Errorf("Home Assistant's will did not reach Zigbee2MQTT; it got %q", zsub.lines())
	}
	ha = hc.subWith(t, "homeassistant", will, disc+"/#", base+"/#")
	all[lamp] = on
	for topic, msg := range all {
		if !waitHas(ha, topic, msg, 10*time.Second) {
			t.Fatalf("Home Assistant after its restart did not get %s %s; it got %q (%s)", topic, msg, ha.lines(), ha.stderr.String())
		}
	}
	if ha.has(lamp, `{"state":"OFF"`) {
		t.Errorf("Home Assistant after its restart got the lamp's replaced state: %q", ha.lines())
	}
}
