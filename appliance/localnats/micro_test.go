package localnats

import (
	"encoding/json"
	"testing"
)

func TestParseMicroSubject(t *testing.T) {
	for subj, want := range map[string]bool{
		"$SRV.PING":               true,
		"$SRV.INFO.lamps":         true,
		"$SRV.STATS.lamps.abc123": true,
		"$SRV.PING.lamps.a.b":     false, // too long
		"$SRV.DELETE":             false, // no such verb
		"$SRV.INFO.*":             false, // a wildcard is no name
		"$SRV.INFO.lamps.>":       false,
		"$SRV":                    false,
		"cap.lamps":               false,
	} {
		if _, ok := parseMicroSubject(subj); ok != want {
			t.Errorf("%s: ok %v, want %v", subj, ok, want)
		}
	}
	q, _ := parseMicroSubject("$SRV.INFO.lamps.abc123")
	if q.subject() != "$SRV.INFO.lamps.abc123" {
		t.Errorf("round trip: %s", q.subject())
	}
}

// TestMarkMicroNode: the node's name goes into an answer's metadata,
// over what the service said there (a service cannot claim another
// node); what is no JSON object is left out.
func TestMarkMicroNode(t *testing.T) {
	out, ok := markMicroNode([]byte(`{"name":"lamps","metadata":{"room":"attic","meshbox_node":"elsewhere"}}`), "beta")
	if !ok {
		t.Fatal("a service's answer was left out")
	}
	var got struct {
		Name     string            `json:"name"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal(out, &got); err != nil || got.Name != "lamps" || got.Metadata["room"] != "attic" || got.Metadata["meshbox_node"] != "beta" {
		t.Errorf("marked: %s (%v)", out, err)
	}
	if out, ok := markMicroNode([]byte(`{"name":"x","metadata":null}`), "beta"); !ok || !json.Valid(out) {
		t.Errorf("null metadata: %s %v", out, ok)
	}
	for _, bad := range []string{`[1,2]`, `"x"`, `{"metadata":[1]}`, `not json`} {
		if _, ok := markMicroNode([]byte(bad), "beta"); ok {
			t.Errorf("%s: kept, want left out", bad)
		}
	}
}
