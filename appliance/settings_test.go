package appliance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSettingsTableInDocs: the table of docs/configuration.md is the one
// SettingsTable makes from the settings, word for word.
func TestSettingsTableInDocs(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(raw)
	want := SettingsTable()
	start := strings.Index(page, "| flag | environment | default |")
	if start < 0 {
		t.Fatal("docs/configuration.md: no table of settings")
	}
	got, _, _ := strings.Cut(page[start:], "\n\n")
	if got+"\n" != want {
		t.Errorf("docs/configuration.md's table:\n%s\nwant SettingsTable():\n%s", got, want)
	}
}

// TestSettingKeys: every setting has one key, every env variable and
// flag sets a setting of the table, and Set reads each kind of value.
func TestSettingKeys(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range settingFields() {
		if seen[s.key] {
			t.Errorf("key %s: twice", s.key)
		}
		seen[s.key] = true
	}
	for _, key := range []string{"node", "log.level", "bridge.request_timeout", "bridge.dedupe", "modules.run_dir", "rows.snapshot_every"} {
		if !seen[key] {
			t.Errorf("key %s: not a setting", key)
		}
	}
	if seen["bridge.dial"] || seen["bridge.node"] || seen["bridge.outbox_path"] {
		t.Errorf("bridge.Config's own fields are settings: %v", seen)
	}
	if got := SettingKey(func(c *Config) any { return &c.Bridge.CommandBatch }); got != "bridge.command_batch" {
		t.Errorf("SettingKey: got %q, want bridge.command_batch", got)
	}
	for _, e := range EnvVars {
		if !seen[e.Field] {
			t.Errorf("%s sets %s, which is not a setting", e.Name, e.Field)
		}
	}
	c := DefaultConfig()
	for _, kv := range [][2]string{{"bridge.request_timeout", "2s"}, {"bridge.prefetch", "7"}, {"cache.max_age", "1h"}, {"pprof", "true"}, {"db", "postgres://h/db"}} {
		if err := c.Set(kv[0], kv[1]); err != nil {
			t.Errorf("Set(%s, %s): %v", kv[0], kv[1], err)
		}
	}
	if c.Bridge.RequestTimeout != 2*time.Second || c.Bridge.Prefetch != 7 || c.Cache.MaxAge.D() != time.Hour || !c.Pprof || c.DB != "postgres://h/db" {
		t.Errorf("Set: got %+v", c)
	}
	for _, kv := range [][2]string{{"bridge.prefetch", "x"}, {"bridge.heartbeat", "5"}, {"bridge.routes", "a"}, {"nosuch", "1"}} {
		if err := c.Set(kv[0], kv[1]); err == nil {
			t.Errorf("Set(%s, %s): got no error", kv[0], kv[1])
		}
	}
}

// TestConfigJSONRoundTrip: a configuration written as JSON reads back the
// same, the bridge's policies and durations included.
func TestConfigJSONRoundTrip(t *testing.T) {
	c := DefaultConfig()
	c.Node = "attic"
	for _, kv := range [][2]string{{"bridge.max_lease", "12m"}, {"cache.keep", "3"}} {
		if err := c.Set(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	data := []byte(`{"bridge": {"dedupe": {"once": {"window": "1h", "max_entries": 10}}, "retry": {"r": {"attempts": 3, "backoff": "1s"}}, "routes": {"echo": "cellar"}}}`)
	if err := c.UnmarshalJSON(data); err != nil {
		t.Fatal(err)
	}
	out, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := back.UnmarshalJSON(out); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	b2, _ := back.MarshalJSON()
	if string(b2) != string(out) {
		t.Errorf("got %s, want %s", b2, out)
	}
	if back.Bridge.MaxLease != 12*time.Minute || back.Bridge.Dedupe["once"].Window != time.Hour || back.Bridge.Retry["r"].Attempts != 3 || back.Bridge.Routes["echo"] != "cellar" {
		t.Errorf("got %+v", back.Bridge)
	}
	if !strings.Contains(string(out), `"max_lease":"12m0s"`) {
		t.Errorf("durations are not Go strings: %s", out)
	}
}
