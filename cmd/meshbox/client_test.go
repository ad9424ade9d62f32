package main

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/appliance"
)

// statusLines prints st as `meshbox status` does and returns its lines.
func statusLines(t *testing.T, st appliance.Status) []string {
	t.Helper()
	var buf bytes.Buffer
	printStatus(&buf, st)
	return strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
}

// hasLine reports whether a line of lines matches the regular expression re.
func hasLine(lines []string, re string) bool {
	r := regexp.MustCompile(re)
	for _, l := range lines {
		if r.MatchString(l) {
			return true
		}
	}
	return false
}

// TestPrintStatusListeners: every listener the node has is in the text
// status, the MQTT and WebSocket ones too; none is made up.
func TestPrintStatusListeners(t *testing.T) {
	st := appliance.Status{Node: "attic", NATS: appliance.NATSStatus{URL: "nats://127.0.0.1:4222",
		WebSocket: "ws://127.0.0.1:8443", MQTT: "mqtt://0.0.0.0:1883"}}
	lines := statusLines(t, st)
	for _, want := range []string{`^nats\s+nats://127\.0\.0\.1:4222`, `^websocket\s+ws://127\.0\.0\.1:8443`, `^mqtt\s+mqtt://0\.0\.0\.0:1883`} {
		if !hasLine(lines, want) {
			t.Errorf("status lacks a line %s:\n%s", want, strings.Join(lines, "\n"))
		}
	}
	st.NATS.WebSocket, st.NATS.MQTT = "", ""
	lines = statusLines(t, st)
	if hasLine(lines, `^(websocket|mqtt)\s`) {
		t.Errorf("a node without MQTT and WebSocket listeners: got\n%s\nwant no line for them", strings.Join(lines, "\n"))
	}
}

// TestPrintStatusLevels: the problems come first, in capitals; notes are
// notes, not warnings; what the node logged is shown at its level, a
// warning as a warning and not as an error.
func TestPrintStatusLevels(t *testing.T) {
	st := appliance.Status{Node: "attic",
		Problems: []string{"mesh database: the database refused the login of user attic"},
		Notes:    []string{"the local NATS server is open"},
		Warnings: []string{"the broker link is not encrypted"},
		Errors: []appliance.ErrorEntry{
			{Level: "ERROR", Component: "bridge", Message: "broker credential refused"},
			{Level: "WARN", Component: "keys", Message: "this node lacks a content key of the mesh"},
		}}
	lines := statusLines(t, st)
	for _, want := range []string{
		`^PROBLEM\s+mesh database: the database refused the login`,
		`^note\s+the local NATS server is open`,
		`^warning\s+the broker link is not encrypted`,
		`^error\s+.*bridge broker credential refused`,
		`^warn\s+.*keys this node lacks a content key`,
	} {
		if !hasLine(lines, want) {
			t.Errorf("status lacks a line %s:\n%s", want, strings.Join(lines, "\n"))
		}
	}
	if hasLine(lines, `^error\s+.*lacks a content key`) {
		t.Errorf("a logged warning shown as an error:\n%s", strings.Join(lines, "\n"))
	}
	if i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "PROBLEM") }); i > 2 {
		t.Errorf("the problem is line %d, want it right after node and started:\n%s", i+1, strings.Join(lines, "\n"))
	}
}
