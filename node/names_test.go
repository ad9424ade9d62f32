package node

import (
	"slices"
	"testing"
	"time"

	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/names/namestest"
)

// TestNamesAgree checks that every way a name enters the node - a peer's
// discovery message, the local subjects it advertises, the expected nodes
// of the bindings, its config - accepts exactly the names package names
// accepts.
func TestNamesAgree(t *testing.T) {
	check := nodeNameChecker(t)
	for _, s := range namestest.Inputs() {
		check(t, s)
	}
	// The name the layers used to disagree on: cap.café is not advertised,
	// and a peer's record claiming it is refused.
	if caps, _, skipped := localNames([]string{"cap.café"}); len(caps) != 0 || !slices.Equal(skipped, []string{"cap.café"}) {
		t.Errorf("cap.café: got caps %v skipped %v, want it skipped", caps, skipped)
	}
}

// FuzzNodeNames checks the node's name entry points against package names
// for any input.
func FuzzNodeNames(f *testing.F) {
	for _, s := range namestest.Inputs() {
		f.Add(s)
	}
	check := nodeNameChecker(f)
	f.Fuzz(func(t *testing.T, s string) { check(t, s) })
}

// nodeNameChecker returns a check of one name against every entry point.
func nodeNameChecker(tb testing.TB) func(*testing.T, string) {
	tb.Helper()
	n, err := New(Config{Name: "self", Link: &fakeLink{}})
	if err != nil {
		tb.Fatal(err)
	}
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	decodes := func(m Message) bool {
		body, err := EncodeMessage(&m)
		if err != nil {
			return false
		}
		_, err = DecodeMessage(m.Type, body, "")
		return err == nil
	}
	return func(t *testing.T, s string) {
		t.Helper()
		nodeOK := names.Node(s) == nil
		capOK := names.Capability(s) == nil
		stageOK := names.Stage(s) == nil
		agree := func(what string, got, want bool) {
			t.Helper()
			if got != want {
				t.Fatalf("%s %q: node says valid=%v, package names says %v", what, s, got, want)
			}
		}
		agree("ValidNodeName", ValidNodeName(s), nodeOK)
		agree("ValidCapabilityName", ValidCapabilityName(s), capOK)

		// A peer's discovery messages.
		agree("node of a hello", decodes(Message{V: 1, Type: TypeHello, Node: s, StartedAt: at}), nodeOK)
		// An empty "to" is an unaddressed query.
		agree("to of a query", decodes(Message{V: 1, Type: TypeQuery, Node: "B", To: s, StartedAt: at}), nodeOK || s == "")
		agree("capability of a hello", decodes(Message{V: 1, Type: TypeHello, Node: "B", StartedAt: at, Capabilities: []string{s}}), capOK)
		agree("stage of an update", decodes(Message{V: 1, Type: TypeUpdate, Node: "B", StartedAt: at, Stages: []string{s}}), stageOK)

		// What local programs host, and so what this node advertises.
		caps, stages, _ := localNames([]string{"cap." + s, "work." + s})
		agree("advertised capability cap.<name>", slices.Equal(caps, []string{s}), capOK)
		agree("advertised stage work.<name>", slices.Equal(stages, []string{s}), stageOK)

		// The bindings' expected nodes and the config.
		agree("SetExpected", n.SetExpected([]string{s}) == nil, nodeOK)
		_, err := Config{Name: s, Link: &fakeLink{}}.withDefaults()
		agree("Config.Name", err == nil, nodeOK)
	}
}
