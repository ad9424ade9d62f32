package appliance

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
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
