package appliance

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/node"
)

// TestConfigurationReference checks docs/configuration.md against the
// code's one table of settings: every environment variable and flag
// (EnvVars, ConfigFlags) is in the page's table and the page names no
// other; its JSON example is a config file LoadFile takes, and it shows
// every key the configuration has.
func TestConfigurationReference(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(raw)
	for _, e := range EnvVars {
		if !strings.Contains(page, "`"+e.Name+"`") {
			t.Errorf("docs/configuration.md does not list %s (config field %s)", e.Name, e.Field)
		}
	}
	for _, f := range ConfigFlags {
		if !strings.Contains(page, "`--"+f.Name) {
			t.Errorf("docs/configuration.md does not list the flag --%s", f.Name)
		}
	}
	// The client commands' own variables, not settings of the node.
	clientOnly := []string{"MESHBOX_CONFIG", "MESHBOX_SERVER", "MESHBOX_CREDS", "MESHBOX_BROKER_ADMIN"}
	for _, m := range regexp.MustCompile("`(MESHBOX_[A-Z_]+)`").FindAllStringSubmatch(page, -1) {
		known := slices.Contains(clientOnly, m[1]) || slices.ContainsFunc(EnvVars, func(e struct{ Name, Field string }) bool { return e.Name == m[1] })
		if !known {
			t.Errorf("docs/configuration.md names %s, which no setting reads", m[1])
		}
	}

	_, rest, ok := strings.Cut(page, "\n```json\n")
	if !ok {
		t.Fatal("docs/configuration.md: no JSON example")
	}
	example, _, _ := strings.Cut(rest, "\n```\n")
	file := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(file, []byte(example), 0o600); err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	if err := c.LoadFile(file); err != nil {
		t.Fatalf("the page's JSON example: %v", err)
	}
	var shown, all map[string]any
	if err := json.Unmarshal([]byte(example), &shown); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &all); err != nil {
		t.Fatal(err)
	}
	var missing []string
	var walk func(prefix string, all, shown map[string]any)
	walk = func(prefix string, all, shown map[string]any) {
		for k, v := range all {
			sv, ok := shown[k]
			if !ok {
				missing = append(missing, prefix+k)
				continue
			}
			if sub, ok := v.(map[string]any); ok {
				if ssub, ok := sv.(map[string]any); ok && len(ssub) > 0 || len(sub) > 0 {
					ssub, _ := sv.(map[string]any)
					walk(prefix+k+".", sub, ssub)
				}
			}
		}
	}
	walk("", all, shown)
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("the page's JSON example lacks keys the configuration has: %v", missing)
	}
}

// TestDefaultsAgree: the page's JSON example shows the defaults a node
// runs with, which are its components' own (one definition each).
func TestDefaultsAgree(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(raw), "\n```json\n")
	example, _, _ := strings.Cut(rest, "\n```\n")
	file := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(file, []byte(example), 0o600); err != nil {
		t.Fatal(err)
	}
	shown := DefaultConfig()
	if err := shown.LoadFile(file); err != nil {
		t.Fatal(err)
	}
	def := DefaultConfig()
	if shown.Bridge.MaxLease != bridge.DefaultMaxLease || def.Bridge.MaxLease != 0 {
		t.Errorf("bridge.max_lease: the page shows %s, the bridge's default is %s (the config leaves it to the bridge: %s)",
			shown.Bridge.MaxLease, bridge.DefaultMaxLease, def.Bridge.MaxLease)
	}
	shown.Bridge.MaxLease = 0
	if len(shown.Bridge.Routes)+len(shown.Bridge.Dedupe)+len(shown.Bridge.Retry) == 0 {
		shown.Bridge.Routes, shown.Bridge.Dedupe, shown.Bridge.Retry = nil, nil, nil // {} on the page: none
	}
	for _, c := range []struct {
		name        string
		shown, want any
	}{
		{"cache", shown.Cache, def.Cache},
		{"bridge", bridgePart(t, shown), bridgePart(t, def)},
		{"mesh", shown.Mesh, def.Mesh},
		{"blobs", shown.Blobs, def.Blobs},
		{"log", shown.Log, def.Log},
		{"nats", shown.NATS, def.NATS},
		{"http", shown.HTTP, def.HTTP},
	} {
		a, _ := json.Marshal(c.shown)
		b, _ := json.Marshal(c.want)
		if string(a) != string(b) {
			t.Errorf("%s: the page shows %s, the defaults are %s", c.name, a, b)
		}
	}
	mods := shown.Modules
	mods.Dir, mods.RunDir = def.Modules.Dir, def.Modules.RunDir // the page's are a packaged node's
	if a, b := fmt2json(mods), fmt2json(def.Modules); a != b {
		t.Errorf("modules: the page shows %s, the defaults are %s", a, b)
	}
	// The components' own constants are the defaults.
	if def.Cache.LoadTimeout.D() != cache.DefaultLoadTimeout || def.Cache.RetryInterval.D() != cache.DefaultRetryInterval ||
		def.Bridge.RequestTimeout != bridge.DefaultRequestTimeout || def.Mesh.HeartbeatInterval.D() != node.DefaultHeartbeatInterval {
		t.Errorf("DefaultConfig does not take its components' defaults: %+v", def)
	}
}

// bridgePart is the bridge part of c as the config file writes it (the
// bridge's settings, durations as Go strings).
func bridgePart(t *testing.T, c Config) json.RawMessage {
	t.Helper()
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var parts map[string]json.RawMessage
	if err := json.Unmarshal(data, &parts); err != nil {
		t.Fatal(err)
	}
	return parts["bridge"]
}

func fmt2json(v any) string { b, _ := json.Marshal(v); return string(b) }
